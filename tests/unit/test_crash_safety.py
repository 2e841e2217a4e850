"""Crash safety: a child process drives a run and is SIGKILLed at a named fault point (before a step,
inside it, after its record is committed, or inside the step's own function). The run is then resumed,
and the side-effect log the steps append to proves that nothing committed ran twice and nothing was lost.

Which steps were committed at the moment of the crash is read from the database file directly.
"""

import json
import signal
import sqlite3

import pytest

from durable_sandbox.engine import Engine, LeaseHeld
from durable_sandbox.stores import SqliteStore
from tests.unit.crash_support import LEASE_TTL, _child, _committed, _crash, _log


async def _resume_here(db_path, run_id, clock):
    clock.advance(LEASE_TTL + 1)  # the dead child's lease has expired
    store = SqliteStore(db_path)
    try:
        return await Engine(store, worker_id="resumer").resume(run_id)
    finally:
        await store.close()


SEQ = ["s1", "s2", "s3"]


# The same three steps with a sync step function (the first runs of a function are in a thread: two commits per
# step), an async one that completes without suspending (its start and outcome in one commit) and an async one
# that suspends (its start committed before it goes on).
SEQ_WORKFLOWS = ["crash-seq", "crash-seq-async-at-once", "crash-seq-async-suspending"]


@pytest.mark.parametrize("workflow", SEQ_WORKFLOWS)
@pytest.mark.parametrize(
    ("fault", "committed_at_crash", "ran_before_crash"),
    [
        ("before:s1", [], []),
        ("before:s2", ["s1"], ["s1"]),
        ("inside:s2", ["s1"], ["s1"]),  # s2's start is recorded (or deferred: async), its function has not run
        ("after:s2", ["s1", "s2"], ["s1", "s2"]),  # s2's completion is committed
        ("after:s3", ["s1", "s2", "s3"], SEQ),  # every step committed, the run's own status not yet
    ],
)
async def test_sigkill_at_fault_points_then_resume(
    db_path, tmp_path, clock, fault, committed_at_crash, ran_before_crash, workflow
):
    log = tmp_path / "effects.log"
    committed = await _crash(db_path, "seq", workflow, log, fault=fault)
    assert committed == committed_at_crash
    assert _log(log) == ran_before_crash

    st = await _resume_here(db_path, "seq", clock)
    assert st.status == "succeeded", st.error
    assert st.result == ["S1", "S2", "S3"]
    final = _log(log)
    assert sorted(set(final)) == SEQ  # nothing lost
    assert final == SEQ  # and here nothing ran twice: every crash point is outside the step functions
    for op in committed:
        assert final.count(op) == 1


@pytest.mark.parametrize("workflow", SEQ_WORKFLOWS)
async def test_sigkill_inside_step_function_reruns_only_that_step(db_path, tmp_path, clock, workflow):
    """Killed after s2's side effect but before s2 returned: s2 was never committed, so it runs again
    (at-least-once); s1, committed, does not."""
    log = tmp_path / "effects.log"
    committed = await _crash(db_path, "mid", workflow, log, die_in="s2")
    assert committed == ["s1"]
    assert _log(log) == ["s1", "s2"]

    st = await _resume_here(db_path, "mid", clock)
    assert st.status == "succeeded", st.error
    assert _log(log) == ["s1", "s2", "s2", "s3"]
    assert _log(log).count("s1") == 1


async def test_repeated_crashes_then_resume_in_another_process(db_path, tmp_path, clock):
    """Crash, resume in a second child that crashes too, then a third child finishes the run."""
    log = tmp_path / "effects.log"
    assert await _crash(db_path, "multi", "crash-seq", log, fault="after:s1") == ["s1"]
    code, out, err = await _child("resume", db_path, "multi", fault="inside:s3", skew=LEASE_TTL + 1)
    assert code == -signal.SIGKILL, (code, out, err)
    assert _committed(db_path, "multi") == ["s1", "s2"]
    code, out, err = await _child("resume", db_path, "multi", skew=2 * (LEASE_TTL + 1))
    assert code == 0, err
    assert json.loads(out) == {"status": "succeeded", "result": ["S1", "S2", "S3"]}
    assert _log(log) == SEQ


async def test_resume_of_a_crashed_run_is_refused_while_its_lease_is_live(db_path, tmp_path):
    log = tmp_path / "effects.log"
    await _crash(db_path, "held", "crash-seq", log, fault="after:s1")
    store = SqliteStore(db_path)
    try:
        with pytest.raises(LeaseHeld):
            await Engine(store, worker_id="impatient").resume("held")
    finally:
        await store.close()
    assert _log(log) == ["s1"]


async def test_orphaned_run_is_recovered_by_a_worker(db_path, tmp_path, clock):
    log = tmp_path / "effects.log"
    await _crash(db_path, "orphan", "crash-seq", log, fault="inside:s3")
    store = SqliteStore(db_path)
    try:
        engine = Engine(store, worker_id="rescuer")
        await engine.worker(idle_exit=True, poll_interval=0.01)
        assert (await engine.inspect("orphan")).status == "running"  # the lease is still live: left alone
        clock.advance(LEASE_TTL + 1)
        await engine.worker(idle_exit=True, poll_interval=0.01)
        st = await engine.inspect("orphan")
    finally:
        await store.close()
    assert st.status == "succeeded", st.error
    assert _log(log) == SEQ


@pytest.mark.parametrize("fault", ["after:first", "inside:p/b", "after:p/b"])
async def test_sigkill_in_parallel_reruns_only_uncommitted_branches(db_path, tmp_path, clock, fault):
    log = tmp_path / "effects.log"
    committed = await _crash(db_path, "par", "crash-par", log, fault=fault)
    before = _log(log)
    assert "first" in committed and before.count("first") == 1
    if fault == "after:p/b":
        assert "p/b" in committed

    st = await _resume_here(db_path, "par", clock)
    assert st.status == "succeeded", st.error
    assert st.result == {"first": "FIRST", "a": "P/A", "b": "P/B", "c": "P/C"}
    final = _log(log)
    assert sorted(set(final)) == ["first", "p/a", "p/b", "p/c"]
    for op in committed:  # committed before the crash: ran exactly once in total
        assert final.count(op) == 1, (op, final)
    for op in set(final) - set(committed):  # not committed: at most once before and once after
        assert final.count(op) <= 2


async def test_sigkill_during_retry_keeps_attempt_numbers(db_path, tmp_path, clock):
    log = tmp_path / "effects.log"
    log.touch()
    committed = await _crash(db_path, "retry", "crash-retry", log, fault="inside:r@2")  # the 2nd attempt
    assert committed == ["s1"]
    assert _log(log) == ["s1", "r"]  # attempt 1 ran (and failed); attempt 2 was killed before running

    st = await _resume_here(db_path, "retry", clock)
    assert st.status == "succeeded", st.error
    assert st.result == "R"
    assert _log(log) == ["s1", "r", "r"]
    con = sqlite3.connect(db_path)
    try:
        rows = con.execute(
            "SELECT status, attempt FROM ops WHERE run_id='retry' AND op_id='r' ORDER BY seq"
        ).fetchall()
    finally:
        con.close()
    assert rows == [("started", 1), ("failed", 1), ("started", 2), ("started", 2), ("completed", 2)]
