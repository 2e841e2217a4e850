"""A lease renewal that fails for a moment does not end the execution (found by the soak: every API server restart
interrupted every running run). The keeper retries a renewal that failed with ``StoreUnavailable`` while the lease
is surely still this worker's (its own monotonic clock: the last successful renewal's send time + TTL, minus a
third of the TTL), cancels the execution at that safety point, before the lease could expire, and cancels at once
on ``LeaseLost`` (the fence moved).

The keeper's tests run on a fake clock (time moves only when the keeper sleeps) and a fake store whose renewals
follow a script; one test runs the real engine on SQLite to show that no interruption is journaled."""

from __future__ import annotations

import asyncio
import itertools
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any, cast

import pytest

import durable_sandbox
from durable_sandbox import Context, workflow
from durable_sandbox.engine.errors import LeaseLost, StoreRefused, StoreUnavailable
from durable_sandbox.engine.lease_keeper import SAFETY_FRACTION, LeaseKeeper, keep_lease
from durable_sandbox.engine.records import Lease, RunRecord
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.store import Store
from durable_sandbox.sessions.hold import HoldSettings, OpenSession
from durable_sandbox.stores import SqliteStore
from durable_sandbox.testing import SteppedClock
from tests.unit.lease_keeper_support import RUN, ScriptedRenewals, unavailable

TTL = 30.0


class Cancellable:
    """What the keeper cancels: the execution's task, stood in for by a task that waits until cancelled."""

    def __init__(self) -> None:
        self.task: asyncio.Task[bool] = asyncio.create_task(asyncio.Event().wait())


async def start(clock: SteppedClock, store: ScriptedRenewals) -> tuple[asyncio.Task[None], Cancellable]:
    wf = Cancellable()
    lease = Lease(RUN, "worker-a", 7, clock.wall() + TTL)  # just claimed
    rt = cast(RunRuntime, object())  # read only when a cancel is requested, which get_run never says
    keeper = asyncio.create_task(keep_lease(LeaseKeeper(store.renew, lease, TTL, clock), cast(Store, store), rt, wf.task,
                                            lambda: None))
    return keeper, wf


async def stop(keeper: asyncio.Task[None], wf: Cancellable) -> None:
    for task in (keeper, wf.task):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_renewal_failing_twice_with_store_unavailable_then_succeeding_leaves_the_execution_running() -> None:
    clock = SteppedClock()
    store = ScriptedRenewals(clock, [unavailable(), unavailable()])
    keeper, wf = await start(clock, store)
    await asyncio.wait_for(store.enough.wait(), timeout=10)
    outcomes = [what for _, what in store.renewals]
    assert outcomes[:3] == ["StoreUnavailable", "StoreUnavailable", "ok"], outcomes
    assert not wf.task.done() and not keeper.done(), "a renewal that failed for a moment ended the execution"
    # The retries came sooner than the next regular renewal (a backoff), and well before the safety point.
    first, second, third = (t for t, _ in store.renewals[:3])
    assert 0 < second - first < TTL / 3 and 0 < third - second < TTL / 3
    assert third - 1000.0 < TTL - TTL * SAFETY_FRACTION
    # Once renewed, the keeper is back to its regular interval.
    assert store.renewals[4][0] - store.renewals[3][0] == pytest.approx(TTL / 3)
    await stop(keeper, wf)


async def test_renewals_failing_until_the_safety_point_cancel_the_execution_before_the_lease_could_expire() -> None:
    clock = SteppedClock()
    store = ScriptedRenewals(clock, [None], forever=unavailable())  # one renewal succeeds, then the store is away
    keeper, wf = await start(clock, store)
    await asyncio.wait_for(keeper, timeout=10)
    assert wf.task.cancelled() or wf.task.cancelling(), "the execution went on past the safety point"
    last_ok = next(t for t, what in store.renewals if what == "ok")
    expiry = last_ok + TTL  # the store's: the renewal's write + TTL
    safety_point = expiry - TTL * SAFETY_FRACTION
    assert clock.now() == pytest.approx(safety_point), "cancelled neither at the safety point nor before expiry"
    assert clock.now() < expiry
    failed = [t for t, what in store.renewals if what == "StoreUnavailable"]
    assert len(failed) >= 3, f"retried only {len(failed)} time(s) before giving up"
    assert all(t < safety_point for t in failed), "a renewal was attempted past the safety point"
    with pytest.raises(asyncio.CancelledError):
        await wf.task


async def test_refused_renewals_keep_the_execution_past_the_safety_point_and_a_failure_after_them_ends_it() -> None:
    """A refusal is not the safety-point rule (engine/lease_keeper.py says why): a run held at a refused commit
    keeps its hold while renewals are refused for longer than the TTL; the first renewal that *fails* after them
    is measured from the last one that succeeded, so it ends the execution at once."""
    clock = SteppedClock()
    refused = StoreRefused("journals is forbidden: the quota is exceeded")
    store = ScriptedRenewals(clock, [None] + [refused] * 6, forever=unavailable())
    keeper, wf = await start(clock, store)
    await asyncio.wait_for(keeper, timeout=10)
    outcomes = [what for _, what in store.renewals]
    assert outcomes == ["ok"] + ["StoreRefused"] * 6 + ["StoreUnavailable"], outcomes
    last_ok, refusals = store.renewals[0][0], [t for t, what in store.renewals if what == "StoreRefused"]
    assert refusals[-1] - last_ok > TTL, "refusals for longer than the lease did not end the execution"
    assert [b - a for a, b in itertools.pairwise(refusals)] == [TTL / 3] * 5, "at the regular interval"
    assert clock.now() == store.renewals[-1][0], "the failure after the refusals ended it at once, with no retry"
    with pytest.raises(asyncio.CancelledError):
        await wf.task


async def test_a_lost_lease_cancels_the_execution_at_once() -> None:
    clock = SteppedClock()
    store = ScriptedRenewals(clock, [LeaseLost(RUN, 7)])
    keeper, wf = await start(clock, store)
    await asyncio.wait_for(keeper, timeout=10)
    assert [what for _, what in store.renewals] == ["LeaseLost"], "a lost lease was renewed again"
    assert clock.now() == pytest.approx(1000.0 + TTL / 3), "not cancelled at the first renewal that found it lost"
    with pytest.raises(asyncio.CancelledError):
        await wf.task


class StalledOnce(SteppedClock):
    """The process stalls (its event loop blocked) for a whole TTL during the keeper's first sleep."""

    async def sleep(self, seconds: float) -> None:
        if not self.slept:
            self.t += TTL
        await super().sleep(seconds)


@pytest.mark.parametrize("renewal", ["succeeds", "fails"])
async def test_a_keeper_that_wakes_late_tries_once_and_a_failure_then_cancels_at_once(renewal: str) -> None:
    clock = StalledOnce()
    store = ScriptedRenewals(clock, [None if renewal == "succeeds" else unavailable()])
    keeper, wf = await start(clock, store)
    if renewal == "succeeds":  # the fence did not move: nobody claimed the run meanwhile
        await asyncio.wait_for(store.enough.wait(), timeout=10)
        assert not wf.task.done() and not keeper.done()
        assert [what for _, what in store.renewals[:2]] == ["ok", "ok"]
        await stop(keeper, wf)
        return
    await asyncio.wait_for(keeper, timeout=10)
    assert [what for _, what in store.renewals] == ["StoreUnavailable"], "retried past the safety point"
    with pytest.raises(asyncio.CancelledError):
        await wf.task


async def test_a_renewal_that_never_answers_cancels_the_execution_at_the_safety_point() -> None:
    """A renewal in flight (an API server that accepted the connection and never answers) is bounded too."""

    class Silent(ScriptedRenewals):
        async def renew(self, lease: Lease, ttl: float) -> Lease:
            self.renewals.append((self.clock.now(), "silent"))
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    ttl = 0.3  # real seconds: the bound on the call in flight is the event loop's
    store = Silent(SteppedClock(), [])
    wf = Cancellable()
    lease = Lease(RUN, "worker-a", 7, store.clock.wall() + ttl)
    keeper = asyncio.create_task(keep_lease(LeaseKeeper(store.renew, lease, ttl, store.clock), cast(Store, store),
                                            cast(RunRuntime, object()), wf.task, lambda: None))
    await asyncio.wait_for(keeper, timeout=10)
    assert [what for _, what in store.renewals] == ["silent"]
    with pytest.raises(asyncio.CancelledError):
        await wf.task


async def test_an_execution_starts_only_on_a_lease_renewed_within_the_last_interval() -> None:
    """Reading the run and its journal took longer than a renewal interval after the claim: the lease is
    renewed before the workflow starts (a fresh one is not), and a lease lost meanwhile starts nothing."""
    clock = SteppedClock()
    store = ScriptedRenewals(clock, [None, LeaseLost(RUN, 7)])
    fresh = LeaseKeeper(store.renew, Lease(RUN, "worker-a", 7, clock.wall() + TTL), TTL, clock)
    await fresh.start()
    assert store.renewals == [], "a lease claimed just now was renewed again"
    old = Lease(RUN, "worker-a", 7, clock.wall() + TTL / 2)  # claimed half a TTL ago
    keeper = LeaseKeeper(store.renew, old, TTL, clock)
    renewed = await keeper.start()
    assert renewed.expires_at == clock.wall() + TTL and keeper.safety_point == pytest.approx(clock.now() + TTL * 2 / 3)
    with pytest.raises(LeaseLost):
        await LeaseKeeper(store.renew, old, TTL, clock).start()


class FlakyRenewals(SqliteStore):
    """SQLite whose first two renewals fail with ``StoreUnavailable`` (the API server restarting)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.renewals: list[str] = []
        self.renewed = asyncio.Event()

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        if len(self.renewals) < 2:
            self.renewals.append("StoreUnavailable")
            raise StoreUnavailable("ConnectionResetError: the API server restarts", lease.run_id)
        renewed = await super().renew(lease, ttl)
        self.renewals.append("ok")
        self.renewed.set()
        return renewed


@workflow(name="test-lease-keeper-outlives-a-restart")
async def outlives(ctx: Context, spec: dict[str, Any]) -> str:
    async def until_renewed() -> str:  # the step runs on while the keeper's renewals fail, then succeed
        await asyncio.wait_for(FLAKY.get().renewed.wait(), timeout=30)
        return "renewed"

    return await ctx.step("wait", until_renewed)


FLAKY: ContextVar[FlakyRenewals] = ContextVar("FLAKY")  # the test's store, seen by the step it runs


async def test_an_execution_outlives_a_store_restart_and_journals_no_interruption(tmp_path: Path) -> None:
    store = FlakyRenewals(tmp_path / "runs.db")
    engine = durable_sandbox.Engine(store, worker_id="worker-a", lease_ttl=0.6)
    FLAKY.set(store)
    try:
        st = await engine.run("test-lease-keeper-outlives-a-restart", {}, run_id="outlives")
        assert st.status == "succeeded", st.error
        assert store.renewals[:3] == ["StoreUnavailable", "StoreUnavailable", "ok"], store.renewals
        events = [e.type for e in await store.read_events("outlives")]
        assert "run.interrupted" not in events and "run.resumed" not in events, events
        rows = await store.load_journal("outlives")
        assert [(r.op_id, r.status) for r in rows if r.op_id == "wait"][-1] == ("wait", "completed")
    finally:
        await engine.aclose()
        await store.close()


@pytest.mark.parametrize("store_away", ["for a moment", "for good"])
async def test_a_sandbox_session_hold_keeps_its_call_through_failed_renewals_until_the_safety_point(
    store_away: str
) -> None:
    """The session hold (sessions/hold.py) uses the same keeper: two renewals failing with ``StoreUnavailable``
    leave its call in flight running; renewals failing on abandon the call and let go of the session (without
    releasing anything) before the lease could expire. Real time, with a short TTL: waited on, never slept."""
    ttl = 0.6
    loop = asyncio.get_running_loop()
    claimed = time.monotonic()
    lease = Lease("dsbx.uid-1.calls", "worker-a", 3, time.time() + ttl)
    attempts: list[str] = []
    third = asyncio.Event()
    closed = loop.create_future()

    async def renew(held: Lease) -> Lease:
        if store_away == "for good" or len(attempts) < 2:
            attempts.append("StoreUnavailable")
            raise StoreUnavailable("ConnectionRefusedError: the API server restarts", held.run_id)
        attempts.append("ok")
        third.set()
        return Lease(held.run_id, held.owner, held.fence, time.time() + ttl)

    async def close(session: OpenSession) -> None:
        closed.set_result(time.monotonic())
        await session.shut(release=lambda _lease: asyncio.sleep(0))

    session = OpenSession(lease, cast(RunRuntime, object()), cast(RunRecord, object()))
    session.in_flight = asyncio.create_task(asyncio.Event().wait())
    session.start(renew, ttl, HoldSettings(idle_seconds=600, max_seconds=600), close)
    try:
        if store_away == "for a moment":
            await asyncio.wait_for(third.wait(), timeout=10)
            assert attempts[:3] == ["StoreUnavailable", "StoreUnavailable", "ok"]
            assert not session.in_flight.done() and not session.lost and not closed.done()
            return
        at = await asyncio.wait_for(closed, timeout=10)
        assert session.lost, "a hold whose lease may have lapsed was let go as if it still held it"
        assert at < claimed + ttl, f"let go {at - claimed:.2f}s after the claim: past the lease's {ttl}s"
        assert len(attempts) >= 2, attempts
        with pytest.raises(asyncio.CancelledError):
            await session.in_flight
    finally:
        await session.shut(release=lambda _lease: asyncio.sleep(0))
        if not session.in_flight.done():
            session.in_flight.cancel()
