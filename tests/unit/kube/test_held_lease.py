"""``HeldLease`` (kube/journal/leases.py), the lease a replica keeps while it reconciles one object, gives up at the
engine's safety point (engine/lease_keeper.py): ``TTL - TTL/3`` after the last successful renewal was *sent*, by
the monotonic clock, retrying failed renewals until then; timed by ``SteppedClock``."""

from __future__ import annotations

import asyncio
from typing import Any

from durable_sandbox.engine.lease_keeper import SAFETY_FRACTION
from durable_sandbox.kube.journal.leases import HeldLease, LeaseGone
from durable_sandbox.testing import SteppedClock

TTL = 15.0
DEADLINE = 5.0  # real seconds a test waits for the renewer to reach a condition


class _Away:
    def unreachable(self, exc: BaseException, where: str) -> bool:
        return False


class _Client:
    away = _Away()


class ScriptedLeases:
    """``Leases`` whose renewals raise the script's errors in turn (then ``forever``, None: succeed); a successful
    one takes ``answer_after`` seconds of the clock to answer."""

    namespace = "team-a"
    client = _Client()

    def __init__(self, clock: SteppedClock, script: list[Exception | None], *, forever: Exception | None = None,
                 answer_after: float = 0.0) -> None:
        self.clock, self.script, self.forever, self.answer_after = clock, list(script), forever, answer_after
        self.renewals: list[tuple[float, str]] = []  # (clock time sent, "ok" or the error's type)
        self.count = asyncio.Event()
        self.wanted = 0

    async def acquire(self, name: str, holder: str, ttl: float, **_: Any) -> int:
        return 7

    async def renew(self, name: str, holder: str, epoch: int, ttl: float) -> None:
        error = self.script.pop(0) if self.script else self.forever
        self.renewals.append((self.clock.now(), "ok" if error is None else type(error).__name__))
        if self.wanted and len(self.renewals) >= self.wanted:
            self.count.set()
        if error is not None:
            raise error
        self.clock.t += self.answer_after


async def _held(leases: ScriptedLeases, clock: SteppedClock) -> tuple[HeldLease, asyncio.Event, float]:
    lost = asyncio.Event()
    held = HeldLease(leases, "dsbx.uid", "replica-1", TTL, on_lost=lost.set, clock=clock)  # type: ignore[arg-type]
    taken_at = clock.now()
    assert await held.take() == 7
    return held, lost, taken_at


def _margin() -> float:
    return TTL - TTL * SAFETY_FRACTION


async def test_renewals_failing_from_the_start_give_up_at_the_safety_point_not_after_the_whole_ttl() -> None:
    clock = SteppedClock()
    leases = ScriptedLeases(clock, [], forever=ConnectionError("the API server restarts"))
    held, lost, taken_at = await _held(leases, clock)
    await asyncio.wait_for(lost.wait(), DEADLINE)
    assert not held.held
    assert clock.now() <= taken_at + _margin(), "given up no later than TTL - TTL/3 after the claim was sent"
    assert len(leases.renewals) >= 3, "failed renewals are retried with a backoff until the safety point"
    assert all(sent < taken_at + _margin() for sent, _ in leases.renewals)


async def test_a_renewal_that_succeeds_after_failures_keeps_the_lease_and_moves_the_safety_point() -> None:
    clock = SteppedClock()
    error = ConnectionError("refused")
    leases = ScriptedLeases(clock, [error, error, None], forever=error)
    _, lost, _ = await _held(leases, clock)
    await asyncio.wait_for(lost.wait(), DEADLINE)
    ok = [sent for sent, outcome in leases.renewals if outcome == "ok"]
    assert len(ok) == 1 and leases.renewals[:3] == [(leases.renewals[0][0], "ConnectionError"),
                                                     (leases.renewals[1][0], "ConnectionError"), (ok[0], "ok")]
    assert ok[0] + TTL / 3 <= clock.now() <= ok[0] + _margin(), "counted from the last success, given up in time"


async def test_the_safety_point_counts_from_when_a_renewal_was_sent_not_when_it_answered() -> None:
    """The one successful renewal takes 4 s to answer: the store's expiry may count from its send time."""
    clock = SteppedClock()
    leases = ScriptedLeases(clock, [None], forever=ConnectionError("refused"), answer_after=4.0)
    _, lost, _ = await _held(leases, clock)
    await asyncio.wait_for(lost.wait(), DEADLINE)
    sent_ok = leases.renewals[0][0]
    assert leases.renewals[0][1] == "ok"
    assert clock.now() <= sent_ok + _margin(), "counted from the send time: given up 4 s before the answer's + 10 s"
    assert all(sent < sent_ok + _margin() for sent, _ in leases.renewals), "no attempt past the safety point"


async def test_a_lease_taken_over_is_given_up_at_once_and_healthy_renewals_keep_it() -> None:
    clock = SteppedClock()
    healthy = ScriptedLeases(clock, [])
    healthy.wanted = 5
    held, lost, taken_at = await _held(healthy, clock)
    await asyncio.wait_for(healthy.count.wait(), DEADLINE)
    assert held.held and not lost.is_set()
    assert [sent - taken_at for sent, _ in healthy.renewals[:3]] == [TTL / 3, 2 * TTL / 3, TTL]
    await held.forget()

    taken = ScriptedLeases(clock, [LeaseGone("dsbx.uid")])
    held, lost, taken_at = await _held(taken, clock)
    await asyncio.wait_for(lost.wait(), DEADLINE)
    assert [sent - taken_at for sent, _ in taken.renewals] == [TTL / 3], "no retry: the lease is someone else's"
