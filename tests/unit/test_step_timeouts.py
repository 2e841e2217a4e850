"""A step timeout on a plain (sync) function that outlives it (issue 33, item 4): Python cannot stop the
thread, so the step fails at the timeout, the run moves on or ends, and nothing waits for the thread:
not the run, not ``asyncio.run`` (which joins the loop's default executor), not ``dsb run``'s exit. A
result the function returns after its timeout is never committed."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from durable_sandbox.engine import Engine, RetryPolicy, workflow
from durable_sandbox.stores import SqliteStore
from tests.dsb import dsb
from tests.unit.engine_support import ops
from tests.unit.process_support import eventually

DEADLINE = 120.0  # generous: the run ends at a 0.2-1 s timeout; this only bounds a hang


def _stuck(release: threading.Event, returned: threading.Event, value: str) -> str:
    release.wait()  # the function's own work: holds until the test lets it go
    returned.set()
    return value


def test_a_run_ends_at_a_sync_steps_timeout_while_its_function_still_runs(tmp_path: Path) -> None:
    """asyncio.run (the loop dsb run and embedders drive runs in) returns at the timeout: the step's thread
    is not one its executor shutdown joins."""
    release, returned = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    @workflow(name="timeouts-stuck")
    async def stuck_wf(ctx: Any) -> str:
        return await ctx.step("stuck", _stuck, release, returned, "late", timeout=0.2)

    async def scenario() -> None:
        store = SqliteStore(tmp_path / "runs.db")
        try:
            outcome["state"] = await Engine(store).run(stuck_wf, run_id="stuck")
        finally:
            await store.close()

    runner = threading.Thread(target=asyncio.run, args=(scenario(),), daemon=True)
    runner.start()
    try:
        runner.join(DEADLINE)
        assert not runner.is_alive(), "the run's event loop waited for the timed-out step's thread"
        assert not returned.is_set(), "the function was still running when the run ended"
        state = outcome["state"]
        assert state.status == "failed"
        assert "Step 'stuck' timed out after 0.2 seconds" in state.error["message"]
        assert ops(state)["stuck"].status == "failed" and ops(state)["stuck"].error["type"] == "StepTimeout"
    finally:
        release.set()


def _attempts(threads: list[threading.Thread], gates: list[threading.Event], values: list[str]) -> str:
    """Attempt n (1-based) holds on gates[n - 1] and returns values[n - 1]."""
    n = len(threads)
    threads.append(threading.current_thread())
    gates[n].wait()
    return values[n]


async def test_a_timed_out_attempts_late_result_is_never_committed(engine: Engine, db_path: Path) -> None:
    """Attempt 1 times out and attempt 2 starts; attempt 1's function then returns (while attempt 2 still runs):
    its value goes nowhere; the step completes with attempt 2's."""
    threads: list[threading.Thread] = []
    gates = [threading.Event(), threading.Event()]

    @workflow(name="timeouts-late-result")
    async def wf(ctx: Any) -> str:
        return await ctx.step("s", _attempts, threads, gates, ["first, late", "second"], timeout=0.2,
                              retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=False))

    run_id = await engine.start(wf, run_id="late")
    try:
        await eventually(lambda: len(threads) == 2, "attempt 2 to start", DEADLINE)
        assert threads[0].daemon and threads[0].is_alive()
        gates[0].set()  # attempt 1 returns now, long after its timeout
        await asyncio.to_thread(threads[0].join, DEADLINE)
        assert not threads[0].is_alive()
        await asyncio.sleep(0)  # one turn of the loop: the late result's hand-over runs (and is dropped)
    finally:
        for gate in gates:
            gate.set()
    state = await engine.wait(run_id, timeout=DEADLINE)
    assert state.status == "succeeded", state.error
    assert state.result == "second"
    con = sqlite3.connect(db_path)
    try:
        rows = con.execute("SELECT status, attempt, result FROM ops WHERE run_id='late' ORDER BY seq").fetchall()
    finally:
        con.close()
    assert [(status, attempt) for status, attempt, _ in rows] == [
        ("started", 1), ("failed", 1), ("started", 2), ("completed", 2)]
    assert not any(result is not None and "late" in json.loads(result) for _, _, result in rows)


def test_dsb_run_exits_at_the_timeout_of_a_function_that_never_returns(tmp_path: Path) -> None:
    """`dsb run` of a workflow whose step function never returns exits once the step times out."""
    ran = dsb("run", "tests.unit.cli_flows:endless_step", "--input", '{"timeout": 1}', "--store",
              str(tmp_path / "runs.db"), process=True, timeout=DEADLINE)
    assert ran.exit_code == 1, ran.output
    assert "Step 'forever' timed out after 1 seconds" in ran.output

