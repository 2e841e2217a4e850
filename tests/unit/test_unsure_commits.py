"""A commit whose outcome is unknown must not journal what it carried twice (the soak's ``soak-003-suspend``).

The mechanism: a sandbox call's completion rides on the run's next commit (engine/deferred.py). The task
executing the run was cancelled (its lease keeper saw the lease lost during an API server restart) while that
commit was in flight: the commit landed, but the task only saw ``CancelledError``, put the completion back
as not written, and the interruption's final commit (``Ending.leave_pending``, still under the same fence, which
no new claim had moved yet) wrote it a second time. The same happens when the store's retries run out after
an answer was lost (``StoreUnavailable``: outcome unknown). Now such records come back ``unsure`` and the
journal is asked before they go again (``RunRuntime.confirm_unsure``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.engine import Context, Engine, workflow
from durable_sandbox.engine.endings import Ending
from durable_sandbox.engine.errors import LeaseLost, StoreUnavailable
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import Commit, Lease, OperationRecord, RunRecord
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore
from tests.unit.engine_support import ops

WORKER = "test-worker"
RUN = "unsure"


class AnswerLost(SqliteStore):
    """The real SQLite store; an armed commit lands (or not) and then raises what the caller sees instead
    of the answer: a cancellation of the task in flight, the store's retries running out."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.then_raise: BaseException | None = None
        self.lands = True

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        exc, self.then_raise = self.then_raise, None
        if exc is None or self.lands:
            await super().commit(run_id, fence, commit)
        if exc is not None:
            raise exc


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[AnswerLost]:
    s = AnswerLost(tmp_path / "runs.db")
    await s.create_run(RunRecord(RUN, "flow"))
    yield s
    await s.close()


async def executing(store: AnswerLost) -> tuple[RunRuntime, Ending]:
    executor = RunExecutor(store, worker_id=WORKER)
    lease = await executor.claim(RUN)
    run = await store.get_run(RUN)
    assert run is not None
    rt = await executor.open_runtime(run, lease)
    return rt, Ending(store, run, lease, rt, worker_id=WORKER, after_run=None)


def record(op_id: str, status: str) -> OperationRecord:
    return OperationRecord(op_id, "sandbox.call", "exec", status, result={"out": op_id} if status == "completed" else None)


async def journal(store: AnswerLost) -> list[tuple[str, str]]:
    return [(r.op_id, r.status) for r in await store.load_journal(RUN)]


UNKNOWN = [asyncio.CancelledError(), StoreUnavailable("ConnectionResetError: the API server restarted", RUN)]


@pytest.mark.parametrize("exc", UNKNOWN, ids=["cancelled-in-flight", "store-unavailable"])
async def test_a_completion_whose_commit_landed_unanswered_is_not_journaled_again(
    store: AnswerLost, exc: BaseException
) -> None:
    rt, ending = await executing(store)
    rt.defer_completion(record("sandbox/c1", "completed"))
    store.then_raise = exc  # the commit carrying c1's completion (with c2's start) lands; its answer is lost
    with pytest.raises(type(exc)):
        await rt.write(record("sandbox/c2", "started"))
    assert await journal(store) == [("sandbox/c1", "completed"), ("sandbox/c2", "started")]

    await ending.leave_pending("run.interrupted")  # what the cancelled execution commits on its way out

    assert await journal(store) == [("sandbox/c1", "completed"), ("sandbox/c2", "started")]
    assert [r.op_id for r in rt.rows] == ["sandbox/c1"]  # c1 is a row of this execution now, with its seq
    assert rt.rows[0].seq == 1


@pytest.mark.parametrize("exc", UNKNOWN, ids=["cancelled-in-flight", "store-unavailable"])
async def test_a_completion_whose_commit_did_not_land_is_still_committed_on_the_way_out(
    store: AnswerLost, exc: BaseException
) -> None:
    rt, ending = await executing(store)
    rt.defer_completion(record("sandbox/c1", "completed"))
    store.then_raise, store.lands = exc, False
    with pytest.raises(type(exc)):
        await rt.write(record("sandbox/c2", "started"))
    assert await journal(store) == []

    await ending.leave_pending("run.interrupted")

    assert await journal(store) == [("sandbox/c1", "completed")]


async def test_a_commit_fenced_out_is_known_not_to_have_landed_and_asks_nothing(store: AnswerLost) -> None:
    rt, _ = await executing(store)
    rt.defer_completion(record("sandbox/c1", "completed"))
    store.then_raise, store.lands = LeaseLost(RUN, rt.fence), False
    with pytest.raises(LeaseLost):
        await rt.write()
    assert rt.deferred.unsure == []
    assert [r.op_id for r in rt.deferred.records] == ["sandbox/c1"]


async def test_the_next_write_of_the_same_execution_does_not_repeat_a_landed_completion(store: AnswerLost) -> None:
    """The riding completion's own flush (engine/deferred.py) failing unanswered, then the run's next write."""
    rt, _ = await executing(store)
    rt.defer_completion(record("sandbox/c1", "completed"))
    store.then_raise = StoreUnavailable("the answer was lost", RUN)
    with pytest.raises(StoreUnavailable):
        await rt.write(hold=False)
    await rt.write(record("sandbox/c2", "started"))
    await rt.write(record("sandbox/c2", "completed"))
    assert await journal(store) == [
        ("sandbox/c1", "completed"), ("sandbox/c2", "started"), ("sandbox/c2", "completed")]
    assert [r.seq for r in await store.load_journal(RUN)] == [1, 2, 3]


async def test_a_journal_with_a_completion_twice_replays_the_first_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal written before the fix (or by any store that doubled a commit): the run goes on from the first
    completion, never from the second, and the log and the run's events say which operation and seqs."""
    calls: list[str] = []

    def c1() -> int:
        calls.append("c1")
        return len(calls)

    @workflow(name="doubled-completion")
    async def flow(ctx: Context) -> list[Any]:
        first = await ctx.step("c1", c1)
        approved = await ctx.callback("go")
        return [first, approved]

    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id=WORKER, lease_ttl=10.0)
    try:
        assert (await engine.run(flow, run_id="doubled")).status == "waiting"
        completed = next(r for r in await store.load_journal("doubled") if r.op_id == "c1" and r.status == "completed")
        lease = await store.claim("doubled", WORKER, 10.0)
        again = OperationRecord(completed.op_id, completed.kind, completed.name, "completed", result=99)
        await store.commit("doubled", lease.fence, Commit([again]))
        await store.release(lease)
        assert await engine.signal("doubled", "go", "yes")
        with caplog.at_level(logging.WARNING, logger="durable_sandbox.engine"):
            st = await engine.resume("doubled")
        assert st.status == "succeeded", st.error
        assert st.result == [1, "yes"]  # the first completion's result, not the second's 99
        assert calls == ["c1"]
        assert ops(st)["c1"].result == 1  # what `dsb history` shows
        notices = [r.getMessage() for r in caplog.records if "completed twice" in r.getMessage()]
        assert len(notices) == 1 and "'c1'" in notices[0] and "different results" in notices[0], notices
        events = [e for e in await store.read_events("doubled") if e.type == "journal.duplicate"]
        assert [(e.data["opId"], e.data["seqs"]) for e in events] == [("c1", [completed.seq, again.seq])]
    finally:
        await engine.aclose()
        await store.close()


class LeaseLostInFlight(SqliteStore):
    """The soak's interleaving: the commit carrying the first call's completion lands, its answer does not
    come (an API server restarting), and meanwhile the lease keeper's renewal finds the lease lost, so the
    execution's task is cancelled in the middle of that commit. The fence has not moved yet (nobody claimed
    the run again), so what the execution commits on its way out still lands."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.lost = False

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        carries = any(r.kind == "sandbox.call" and r.status == "completed" for r in commit.records)
        await super().commit(run_id, fence, commit)
        if carries and not self.lost:
            self.lost = True
            await asyncio.Event().wait()  # no answer: until the lease keeper cancels the task

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        if self.lost:
            raise LeaseLost(lease.run_id, lease.fence)
        return await super().renew(lease, ttl)


@workflow(name="test-unsure-two-calls")
async def two_calls(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("sandbox", provider="local") as sbx:
        await sbx.write_file("a.txt", "a")
        await sbx.write_file("b.txt", "b")  # its start carries the first call's completion
    return {}


async def test_an_execution_cancelled_by_a_lost_lease_mid_commit_journals_each_completion_once(
    tmp_path: Path, home: Path
) -> None:
    store = LeaseLostInFlight(tmp_path / "runs.db")
    engine = durable_sandbox.Engine(store, providers={"local": LocalProvider(home)}, worker_id=WORKER, lease_ttl=0.3)
    try:
        with pytest.raises(asyncio.CancelledError):  # interrupted, not cancelled by a user: left pending
            await engine.run("test-unsure-two-calls", {}, run_id="lost-mid-commit")
        assert store.lost, "the commit carrying the first completion never went through the test's store"
        rows = await store.load_journal("lost-mid-commit")
        completions = [r.op_id for r in rows if r.kind == "sandbox.call" and r.status == "completed"]
        assert len(completions) == 1, [(r.seq, r.op_id, r.status) for r in rows]
        run = await store.get_run("lost-mid-commit")
        assert run is not None and run.status == "pending"
        st = await engine.resume("lost-mid-commit")
        assert st.status == "succeeded", st.error
        rows = await store.load_journal("lost-mid-commit")
        completions = [r.op_id for r in rows if r.kind == "sandbox.call" and r.status == "completed"]
        assert len(completions) == len(set(completions)) == 2, [(r.seq, r.op_id, r.status) for r in rows]
    finally:
        await engine.aclose()
        await store.close()
