"""kube/reporting/status.py: the bounded status projection of a journal and the coalescing of status patches."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.engine.records import ErrorInfo, RunStatus
from durable_sandbox.kube.reporting.events import lifecycle_events
from durable_sandbox.kube.reporting.status import RECENT_OPERATIONS, Extra, Projection, StatusWriter, render
from durable_sandbox.stores import SqliteStore
from durable_sandbox.workflows import sandbox_agent


async def _agent_run(store: SqliteStore, n: int, **spec: Any) -> str:
    engine = durable_sandbox.Engine(store, worker_id="w")
    try:
        calls = [{"type": "shell", "command": f"echo {i}"} for i in range(n)]
        state = await engine.run(sandbox_agent.NAME, {"toolCalls": calls, **spec}, run_id="r")
        assert state.status == "succeeded"
    finally:
        await engine.aclose()
    return state.run_id


async def test_projection_of_a_run_with_loss_recovery(store: SqliteStore) -> None:
    run_id = await _agent_run(store, 30, snapshotEveryNCalls=4, injectLossAfterNCalls=10)
    rows = await store.load_journal(run_id)
    run = await store.get_run(run_id)
    assert run is not None
    p = Projection(total_calls=30)
    # Fed in commit-sized pieces, as the operator's observed store does.
    for i in range(0, len(rows), 3):
        p.feed(rows[i : i + 3])
    p.feed(rows[:5])  # a re-read overlapping what was fed is ignored
    st = render(run, p, Extra(generation=3), run_id=run_id)
    assert st["phase"] == "Succeeded" and st["calls"] == {"completed": 30, "total": 30}
    assert st["recoveryCount"] == 1
    assert st["latestSnapshot"] is None  # every snapshot was deleted at finalization
    assert len(st["recentOperations"]) == RECENT_OPERATIONS
    assert st["recentOperations"][-1]["opId"] == "sandbox/finalize"
    assert st["result"]["recoveryCount"] == 1  # small results are inline
    assert st["currentCall"] is None and st["pendingCallbacks"] == []
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Succeeded"]["status"] == "True" and conds["Failed"]["status"] == "False"
    assert all(c["observedGeneration"] == 3 for c in conds.values())
    assert len(json.dumps(st)) < 16_000  # bounded whatever the journal's length
    reasons = [e.reason for e in lifecycle_events(rows)]
    assert reasons.count("Provisioned") == 1 and "SandboxLost" in reasons and "Recovered" in reasons
    assert reasons.count("SnapshotTaken") == 30 // 4


async def test_large_results_are_referenced_and_errors_are_cut(store: SqliteStore) -> None:
    run_id = await _agent_run(store, 1)
    run = await store.get_run(run_id)
    assert run is not None
    run.result = {"blob": "x" * 10_000}
    st = render(run, Projection(), Extra(), run_id=run_id)
    assert st["result"] is None and st["resultRef"]
    run.status, run.error = RunStatus.FAILED, ErrorInfo("Boom", "y" * 5000)
    st = render(run, Projection(), Extra(), run_id=run_id)
    assert st["phase"] == "Failed" and len(st["error"]["message"]) <= 1024


def test_rejection_renders_failed_with_the_reason() -> None:
    st = render(None, Projection(), Extra(generation=1, rejected=("WorkflowNotAllowed", "spec.entrypoint: no")),
                run_id="x-1")
    conds = {c["type"]: c for c in st["conditions"]}
    assert st["phase"] == "Failed" and conds["Failed"]["reason"] == "WorkflowNotAllowed"
    assert conds["Ready"]["status"] == "False"


async def test_status_writes_are_coalesced_except_phase_changes() -> None:
    written: list[dict[str, Any]] = []

    async def patch(doc: dict[str, Any]) -> None:
        written.append(doc)

    writer = StatusWriter(patch, interval=3600.0)  # nothing but phase changes and the final flush may write
    for i in range(100):
        writer.offer({"phase": "Running", "n": i})
    await writer.flush()  # what the first (urgent: a new phase) write would have written by now
    writer.offer({"phase": "Running", "n": 100})
    writer.offer({"phase": "Succeeded", "n": 101})  # a phase change is written at once
    await writer.aclose()
    assert [d["n"] for d in written] == [99, 101]
    assert writer.writes == 2


async def test_a_callable_interval_is_asked_before_every_write() -> None:
    """The operator's budget for clock-driven writes: the interval stretches as more Workflows run."""
    written: list[int] = []
    asked: list[float] = []
    interval = 3600.0

    async def patch(doc: dict[str, Any]) -> None:
        written.append(doc["n"])

    def current() -> float:
        asked.append(interval)
        return interval

    writer = StatusWriter(patch, interval=current)
    writer.offer({"phase": "Running", "n": 1})  # a new phase: written at once
    for _ in range(1000):
        if written:
            break
        await asyncio.sleep(0)
    writer.offer({"phase": "Running", "n": 2})  # waits the hour the interval says...
    for _ in range(20):
        await asyncio.sleep(0)
    assert written == [1] and asked, "the writer must ask the callable, and wait what it says"
    interval = 0.0  # ...until the interval shrinks; it is asked again at the next wake-up
    writer.offer({"phase": "Succeeded", "n": 3})
    await writer.aclose()
    assert written == [1, 3]


async def test_a_document_offered_during_a_write_is_written_after_it() -> None:

    written: list[int] = []
    release = asyncio.Event()
    entered = asyncio.Event()
    two = asyncio.Event()

    async def slow_patch(doc: dict[str, Any]) -> None:
        entered.set()
        await release.wait()
        written.append(doc["n"])
        if len(written) == 2:
            two.set()

    writer = StatusWriter(slow_patch, interval=0.0)
    writer.offer({"phase": "Running", "n": 1})
    await entered.wait()  # the first write is under way
    writer.offer({"phase": "Running", "n": 2})  # same phase: no new task, the running one must take it
    release.set()
    await asyncio.wait_for(two.wait(), 30)
    assert written == [1, 2]
    await writer.aclose()


async def test_a_slow_write_spaces_out_the_next_ones_but_not_phase_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    from types import SimpleNamespace

    from durable_sandbox.kube.reporting import status as status_module

    clock = [1000.0]  # the writer's monotonic clock, moved only by the API server's (fake) write time
    monkeypatch.setattr(status_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    written: list[int] = []
    first, second = asyncio.Event(), asyncio.Event()

    async def patch(doc: dict[str, Any]) -> None:
        clock[0] += 2.0  # a big Workflow: the write took 2 s
        written.append(doc["n"])
        (first if len(written) == 1 else second).set()

    writer = StatusWriter(patch, interval=1.0)
    assert writer.gap() == 1.0
    writer.offer({"phase": "Running", "n": 1})
    await asyncio.wait_for(first.wait(), 30)
    assert writer.gap() == 2.0 * status_module.WRITE_COST_FACTOR
    writer.offer({"phase": "Running", "n": 2})  # same phase: waits for the gap (no clock moves, so it never ends)
    for _ in range(10):
        await asyncio.sleep(0)
    assert written == [1]
    writer.offer({"phase": "Succeeded", "n": 3})  # a phase change is written at once, gap or not
    await asyncio.wait_for(second.wait(), 30)
    assert written == [1, 3]
    await writer.aclose()
    # However slow the writes (the last took 2 s; say one took 10 s), progress shows at least every 30 s.
    writer._last_duration = 10.0
    assert writer.gap() == status_module.MAX_WRITE_GAP


async def test_pending_callbacks_show_their_payload(store: SqliteStore) -> None:
    from examples.flows import hello_flow

    engine = durable_sandbox.Engine(store, worker_id="w")
    try:
        state = await engine.run(hello_flow.hello, {"name": "Ada", "approve": True}, run_id="cb")
    finally:
        await engine.aclose()
    assert state.status == "waiting"
    run = await store.get_run("cb")
    p = Projection()
    p.feed(await store.load_journal("cb"))
    st = render(run, p, Extra(), run_id="cb")
    assert st["phase"] == "Waiting"
    assert st["pendingCallbacks"] == [{"id": "approval", "payload": {"question": "Send 'Hello, Ada!'?"}}]
    assert {c["type"]: c["status"] for c in st["conditions"]}["WaitingForSignal"] == "True"


async def test_a_projection_catches_up_on_rows_another_replica_committed(store: SqliteStore) -> None:
    """A replica's projection is made when it admits a run; if another replica then commits the rest of the
    run (and finishes it), the rows this replica reads from the journal (ObservedStore reports every read)
    are folded before it writes status: the final status shows the run's retained snapshot, not an older one
    (the chaos soak, seed 18)."""
    from durable_sandbox.kube.workflow.observed import ObservedStore

    run_id = await _agent_run(store, 4, snapshotEveryNCalls=1, retainLatestSnapshot=True)
    rows = await store.load_journal(run_id)
    retained = next(r.meta["retained"] for r in rows if r.op_id == "sandbox/finalize")
    cut = next(i for i, r in enumerate(rows) if r.op_id == "sandbox/snapshot/2" and r.status == "completed") + 1
    p = Projection(total_calls=4)
    p.feed(rows[:cut])  # admitted mid-run: two snapshots in, the other replica went on
    assert p.latest_snapshot not in (None, retained)

    p.catch_up(rows[cut + 2 :])  # rows that do not continue what is folded: never folded out of order
    assert p.last_seq == rows[cut - 1].seq

    observed = ObservedStore(store, on_write=lambda *_: None, on_read=lambda rid, read: p.catch_up(read))
    assert await observed.journal_since(run_id, p.last_seq) == rows[cut:]
    run = await store.get_run(run_id)
    st = render(run, p, Extra(generation=1), run_id=run_id)
    assert st["latestSnapshot"] == retained
    assert st["calls"] == {"completed": 4, "total": 4}


async def test_a_failed_run_with_an_attempt_left_is_retrying_not_failed(store: SqliteStore) -> None:
    """spec.retry: while the next attempt waits, neither Failed nor Succeeded is True (a `kubectl wait
    --for=condition=Failed` would stop at the first attempt), and the backoff is shown; the last attempt's
    failure is final."""
    from durable_sandbox.engine.driver import RetrySchedule, RunPolicy

    run_id = await _agent_run(store, 1)
    run = await store.get_run(run_id)
    assert run is not None
    run.status, run.error = RunStatus.FAILED, ErrorInfo("ToolCallFailed", "exit 7")
    policy = RunPolicy(retry=RetrySchedule(max_attempts=2, initial_interval=8))
    st = render(run, Projection(), Extra(policy=policy), run_id=run_id)
    conds = {c["type"]: c for c in st["conditions"]}
    assert st["phase"] == "Retrying" and (st["attempt"], st["maxAttempts"]) == (1, 2)
    assert st["wakeAt"] is not None and st["finishedAt"] is None
    assert conds["Failed"]["status"] == "False" and conds["Succeeded"]["status"] == "False"
    assert conds["Failed"]["reason"] == "Retrying"
    assert "attempt 1 of 2 failed (ToolCallFailed: exit 7); attempt 2 of 2 starts at " in conds["Failed"]["message"]
    assert st["error"]["message"] == "exit 7"  # the failed attempt's error stays visible
    run.epoch = 1  # the last attempt failed: final
    st = render(run, Projection(), Extra(policy=policy), run_id=run_id)
    conds = {c["type"]: c for c in st["conditions"]}
    assert st["phase"] == "Failed" and conds["Failed"]["status"] == "True" and st["wakeAt"] is None
    run.epoch = 0  # a retry that could start only after spec.timeoutSeconds never starts: final too
    late = RunPolicy(timeout=run.updated_at - run.created_at + 1, retry=policy.retry)
    assert render(run, Projection(), Extra(policy=late), run_id=run_id)["phase"] == "Failed"


async def test_recent_operations_name_the_calls_command_and_a_failed_calls_exit_code(store: SqliteStore) -> None:
    engine = durable_sandbox.Engine(store, worker_id="w")
    try:
        calls = [{"type": "shell", "command": "echo ok"},
                 {"type": "shell", "command": "echo nope >&2; exit 7", "failurePolicy": {"onNonZeroExit": "fail"}}]
        state = await engine.run(sandbox_agent.NAME, {"toolCalls": calls}, run_id="f")
    finally:
        await engine.aclose()
    assert state.status == "failed"
    run = await store.get_run("f")
    assert run is not None
    p = Projection(total_calls=2)
    p.feed(await store.load_journal("f"))
    st = render(run, p, Extra(), run_id="f")
    shown = [(op["target"], op.get("exitCode"), op["status"]) for op in st["recentOperations"] if "target" in op]
    assert shown == [("echo ok", 0, "completed"), ("echo nope >&2; exit 7", 7, "failed")]
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert failed["message"].endswith("; command: echo nope >&2; exit 7; stderr: nope"), failed


async def test_every_condition_says_something_and_ready_means_making_progress(store: SqliteStore) -> None:
    run_id = await _agent_run(store, 1)
    run = await store.get_run(run_id)
    assert run is not None
    st = render(run, Projection(), Extra(), run_id=run_id)
    conds = {c["type"]: c for c in st["conditions"]}
    assert all(c["message"] for c in conds.values()), conds  # no condition that says nothing
    assert (conds["Ready"]["status"], conds["Ready"]["message"]) == ("False", "the run succeeded: it is finished")
    run.status = RunStatus.RUNNING
    paused = {c["type"]: c for c in render(run, Projection(), Extra(suspended=True), run_id=run_id)["conditions"]}
    assert paused["Ready"]["status"] == "False" and paused["Ready"]["reason"] == "Suspended"  # paused: no progress
    assert paused["Suspended"]["status"] == "True"
