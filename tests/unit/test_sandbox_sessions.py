"""Sandbox sessions (DESIGN section 6) against the local provider, through ``durable_sandbox.Engine``.

Every test ends by asserting that the local provider's workspace, snapshot and lease directories are
empty (a test that is handed a retained snapshot deletes it first): nothing a run owned outlives it.
Empty means every entry counts, hidden ones too: a snapshot's temp file (``.lsnap-*.tmp``), a lease's temp
file and a destroyed workspace's trash (``.trash-*``) are leaks like any other (``LocalProvider.leftovers``).
Crashes are real process deaths (SIGKILL at a deterministic point in a child process); losses are
injected at deterministic points through a provider wrapper; nothing waits on a timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.engine.errors import InvalidInput, RunNotFound
from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.providers.contract import (
    Capability,
    SandboxHandle,
    SandboxSpec,
    ToolCall,
)
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes.session import MAX_RECOVERIES
from tests.unit.sandbox_session_support import (
    Hooked,
    db,
    derived_id,
    engine_for,
    journal_index,
    local,
    run_child,
)

__all__ = ["db", "local"]  # fixtures

AGENT = "sandbox-agent"


@pytest.fixture
async def engine(db: Path, local: Hooked) -> AsyncIterator[durable_sandbox.Engine]:
    e = engine_for(db, {"local": local})
    yield e
    await e.aclose()


def agent_spec(calls: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return {"toolCalls": calls, **options}


def results(state: durable_sandbox.RunState) -> list[tuple[int, str, str]]:
    return [(r["exitCode"], r["stdout"], r["stderr"]) for r in state.result["toolResults"]]


def kinds(rows: list[OperationRecord], kind: str, status: str = "completed") -> list[OperationRecord]:
    return [r for r in rows if r.kind == kind and r.status == status]


CALLS = [
    {"type": "write_file", "path": "a.txt", "contents": "hello\n"},
    {"type": "shell", "command": "cat a.txt; echo more >> a.txt"},
    {"type": "shell", "command": "echo broken >> a.txt; ls nope"},  # nonzero exit that mutates the workspace
    {"type": "read_file", "path": "a.txt"},
    {"type": "shell", "command": "wc -l < a.txt"},
]
EXPECTED = [
    (0, "wrote a.txt 6 bytes", ""),
    (0, "hello\n", ""),
    (2, "", "ls: cannot access 'nope': No such file or directory\n"),
    (0, "hello\nmore\nbroken\n", ""),
    (0, "3\n", ""),
]


# ------------------------------------------------------------------------------------------ op ids


async def test_derived_operation_ids_are_a_sha256_of_run_session_and_index(engine: durable_sandbox.Engine) -> None:
    state = await engine.run(AGENT, agent_spec(CALLS), run_id="ids-1")
    assert state.status == "succeeded", state.error
    ids = [r["operationId"] for r in state.result["toolResults"]]
    assert ids == [derived_id("ids-1", i) for i in range(len(CALLS))]
    assert all(len(i) == len("dsv1_") + 40 for i in ids)
    rows = await engine.history("ids-1")
    assert [r.op_id for r in kinds(rows, "sandbox.call")] == [f"sandbox/{i}" for i in ids]
    # Another run id gives other ids: they are per run, not per position.
    other = await engine.run(AGENT, agent_spec(CALLS[:1]), run_id="ids-2")
    assert other.result["toolResults"][0]["operationId"] == derived_id("ids-2", 0) != ids[0]


async def test_caller_given_operation_ids_are_used_as_is(engine: durable_sandbox.Engine, local: Hooked) -> None:
    calls = [dict(CALLS[0], operationId="write-greeting"), CALLS[1], dict(CALLS[3], operationId="fetch:a.txt/1")]
    state = await engine.run(AGENT, agent_spec(calls), run_id="given")
    assert state.status == "succeeded", state.error
    assert [r["operationId"] for r in state.result["toolResults"]] == ["write-greeting", derived_id("given", 1), "fetch:a.txt/1"]
    # The provider sees the same ids (it is what a deduplicating provider would key on).
    assert local.calls("execute") == ["write-greeting", derived_id("given", 1), "fetch:a.txt/1"]


async def test_duplicate_operation_ids_are_rejected_before_provisioning(engine: durable_sandbox.Engine,
                                                                        local: Hooked, home: Path) -> None:
    calls = [dict(CALLS[0], operationId="same"), CALLS[1], dict(CALLS[2], operationId="same")]
    # The manifest input is validated before a run is created: nothing runs, nothing is recorded.
    with pytest.raises(InvalidInput) as caught:
        await engine.run(AGENT, agent_spec(calls), run_id="dup-manifest")
    assert "toolCalls[2].operationId 'same' duplicates toolCalls[0]" in str(caught.value)
    with pytest.raises(RunNotFound):
        await engine.inspect("dup-manifest")
    # Code-first: the same rule, enforced by the session before it provisions.
    state = await engine.run("test-sessions-duplicate-ids", {}, run_id="dup-code")
    assert state.status == "failed"
    assert "operation id 'fetch' is given to calls 0 and 2" in state.error["message"]
    assert "rejected before provisioning" in state.error["message"]
    assert local.log == [], "nothing may reach the provider"
    assert not any(k.startswith("sandbox") for r in await engine.history("dup-code") for k in [r.kind])
    assert list((home / "local" / "workspaces").iterdir()) == []


# ------------------------------------------------------------------------------------------ snapshots


async def test_snapshot_rotation_records_the_new_snapshot_before_deleting_the_old(engine: durable_sandbox.Engine,
                                                                                  local: Hooked) -> None:
    calls = [{"type": "shell", "command": f"echo {i} >> log.txt"} for i in range(7)]
    state = await engine.run(AGENT, agent_spec(calls, snapshotEveryNCalls=2), run_id="rot")
    assert state.status == "succeeded", state.error
    rows = await engine.history("rot")
    taken = kinds(rows, "sandbox.snapshot")
    assert [r.op_id for r in taken] == ["sandbox/snapshot/2", "sandbox/snapshot/4", "sandbox/snapshot/6"]
    ids = [r.result["snapshotId"] for r in taken]
    assert len(set(ids)) == 3
    for old, new in [("sandbox/snapshot/2", "sandbox/snapshot/4"), ("sandbox/snapshot/4", "sandbox/snapshot/6")]:
        assert journal_index(rows, new, "completed") < journal_index(rows, f"{old}/delete", "started"), (
            f"{old} was deleted before its replacement {new} was recorded")
    # Each snapshot is taken right after its call completed, and the calls after it wait for the rotation.
    assert journal_index(rows, "sandbox/snapshot/2/delete", "completed") < journal_index(
        rows, f"sandbox/{derived_id('rot', 4)}", "started")
    # At every snapshot taken and every delete, the provider itself never held more than two.
    assert local.population and max(local.population) == 2
    assert local.calls("snapshot") == ids
    assert local.calls("delete_snapshot") == ids, "superseded ones in order, then the last one at finalization"
    assert state.snapshots == []


# ------------------------------------------------------------------------------------------ recovery


@pytest.mark.parametrize("inject_after", [3, 4])
async def test_recovery_after_injected_loss_replays_calls_including_a_nonzero_exit(
        engine: durable_sandbox.Engine, local: Hooked, inject_after: int) -> None:
    baseline = await engine.run(AGENT, agent_spec(CALLS), run_id=f"base-{inject_after}")
    assert results(baseline) == EXPECTED
    run_id = f"lossy-{inject_after}"
    state = await engine.run(AGENT, agent_spec(CALLS, snapshotEveryNCalls=2, injectLossAfterNCalls=inject_after), run_id=run_id)
    assert state.status == "succeeded", state.error
    assert results(state) == EXPECTED, "the recovered workspace is the one the calls built"
    assert state.result["recoveryCount"] == 1 and state.recovery_count == 1
    rows = await engine.history(run_id)
    [loss] = kinds(rows, "sandbox.inject_loss")
    [restore] = kinds(rows, "sandbox.restore")
    assert restore.meta["reason"] == "recovery"
    assert journal_index(rows, "sandbox/snapshot/2", "completed") < journal_index(rows, loss.op_id, "started")
    if inject_after == 3:
        # The nonzero-exit call (index 2) came after the snapshot at 2: it is replayed with its own op id.
        assert restore.meta["snapshotId"] == kinds(rows, "sandbox.snapshot")[0].result["snapshotId"]
        assert restore.meta["replayed"] == [f"sandbox/{derived_id(run_id, 2)}"]
        assert local.calls("execute").count(derived_id(run_id, 2)) == 2
    else:
        # A loss right after the snapshot at 4: the snapshot is taken first, nothing is replayed.
        assert journal_index(rows, "sandbox/snapshot/4", "completed") < journal_index(rows, loss.op_id, "started")
        assert restore.meta["snapshotId"] == kinds(rows, "sandbox.snapshot")[1].result["snapshotId"]
        assert restore.meta["replayed"] == []
    assert not any(r.kind == "sandbox.call" and r.meta.get("lost") for r in rows)
    assert all("inject" not in r["stdout"] for r in state.result["toolResults"]), "loss is never a tool result"


@pytest.mark.parametrize("command", ["date +%N", "echo x >> {counter} && wc -l < {counter}"],
                         ids=["clock", "counter-outside-workspace"])
async def test_replay_with_a_different_outcome_fails_and_destroys_the_replacement(
        engine: durable_sandbox.Engine, local: Hooked, tmp_path: Path, command: str) -> None:
    counter = tmp_path / "invocations"
    calls = [CALLS[0], {"type": "shell", "command": command.format(counter=counter)}, CALLS[3]]
    state = await engine.run(AGENT, agent_spec(calls, injectLossAfterNCalls=2), run_id="diverge")
    assert state.status == "failed"
    op = derived_id("diverge", 1)
    assert f"Reconstruction operation {op} produced a different outcome." in state.error["message"]
    rows = await engine.history("diverge")
    [restore] = [r for r in rows if r.kind == "sandbox.restore" and r.status == "failed"]
    replacement = next(r for r in rows if r.op_id == restore.op_id and r.meta.get("handle")).meta["handle"]["id"]
    destroyed = [r for r in kinds(rows, "sandbox.destroy") if r.meta.get("sandboxId") == replacement]
    assert [r.meta["reason"] for r in destroyed] == ["rejected"]
    assert replacement in local.calls("destroy")
    assert state.recovery_count == 0
    assert local.calls("execute").count(derived_id("diverge", 2)) == 0, "nothing runs on an unfaithful sandbox"


async def test_recovery_budget_is_three_per_run(engine: durable_sandbox.Engine, local: Hooked) -> None:
    async def lose_every_time(handle: SandboxHandle, call: ToolCall) -> None:
        await local.inner.inject_loss(handle)

    local.before_execute = lose_every_time
    state = await engine.run(AGENT, agent_spec(CALLS), run_id="doomed")
    assert state.status == "failed"
    assert MAX_RECOVERIES == 3
    assert "was lost again after 3 recoveries (the budget per run); giving up" in state.error["message"]
    assert len(local.calls("provision")) == 1 + 3, "first sandbox plus one per recovery"
    assert state.recovery_count == 3
    # Every sandbox it made is recorded as destroyed.
    rows = await engine.history("doomed")
    destroyed = {r.meta["sandboxId"] for r in kinds(rows, "sandbox.destroy") if r.meta.get("sandboxId")}
    assert set(local.calls("provision")) <= destroyed


async def test_losses_during_replay_count_against_the_budget(engine: durable_sandbox.Engine, local: Hooked) -> None:
    """From the third call on the sandbox dies under every call, replays included: a clean budget failure."""
    async def lose_from_the_third_call(handle: SandboxHandle, call: ToolCall) -> None:
        if local.executes >= 2:
            await local.inner.inject_loss(handle)

    local.before_execute = lose_from_the_third_call
    state = await engine.run(AGENT, agent_spec(CALLS), run_id="doomed-replay")
    assert state.status == "failed"
    assert "was lost again after 3 recoveries" in state.error["message"]
    assert len(local.calls("provision")) == 1 + 3


async def test_loss_injection_is_refused_before_provisioning_by_a_provider_without_it(db: Path, home: Path) -> None:
    other = Hooked(LocalProvider(home), name="other", without=frozenset({Capability.LOSS_INJECTION}))
    engine = engine_for(db, {"other": other})
    try:
        spec = agent_spec(CALLS[:2], sandbox={"provider": "other"}, injectLossAfterNCalls=1)
        state = await engine.run(AGENT, spec, run_id="refused")
    finally:
        await engine.aclose()
    assert state.status == "failed"
    assert state.error["type"] == "UnsupportedCapability"
    assert state.error["message"] == (
        "Sandbox provider [other] does not support [loss_injection]; the operation was not attempted.")
    assert other.log == []
    assert other.inner.leftovers() == []


# ------------------------------------------------------------------------------------------ finalization


async def test_retained_snapshot_on_success_is_named_in_the_result_and_handed_over(engine: durable_sandbox.Engine,
                                                                                    local: Hooked) -> None:
    state = await engine.run(AGENT, agent_spec(CALLS[:4], snapshotEveryNCalls=2, retainLatestSnapshot=True), run_id="keep")
    assert state.status == "succeeded", state.error
    kept = state.result["latestSnapshot"]
    rows = await engine.history("keep")
    assert kept == kinds(rows, "sandbox.snapshot")[-1].result["snapshotId"]
    assert local.inner.list_snapshots() == [kept], "the superseded snapshot is gone, the retained one exists"
    assert local.inner.leftovers() == [local.inner.snapshots_dir / f"{kept}.tar"], "no sandbox or lease is left"
    # The caller owns it now: it restores to the workspace the calls built, and the caller deletes it.
    handle = await local.inner.restore(kept, SandboxSpec(), lease_seconds=60)
    read = await local.inner.execute(handle, ToolCall(operation_id="check", type="read_file", args={"path": "a.txt"}))
    assert read.stdout == "hello\nmore\nbroken\n"
    await local.inner.destroy(handle)
    await local.inner.delete_snapshot(kept)


async def test_nothing_is_retained_when_the_run_fails(engine: durable_sandbox.Engine, local: Hooked) -> None:
    state = await engine.run("test-sessions-fails-inside", {}, run_id="keep-failed")
    assert state.status == "failed" and "the agent gave up" in state.error["message"]
    rows = await engine.history("keep-failed")
    [final] = [r for r in rows if r.op_id == "sandbox/finalize"]
    assert final.meta == {"finalized": True, "retained": None, "succeeded": False}
    assert len(local.calls("snapshot")) == 2 and local.calls("delete_snapshot") == local.calls("snapshot")
    assert local.calls("destroy") == local.calls("provision")


async def test_finalization_on_success_destroys_the_sandbox_and_deletes_snapshots(engine: durable_sandbox.Engine,
                                                                                  local: Hooked) -> None:
    state = await engine.run(AGENT, agent_spec(CALLS, snapshotEveryNCalls=1), run_id="final-ok")
    assert state.status == "succeeded" and state.result["latestSnapshot"] is None
    rows = await engine.history("final-ok")
    assert rows[-1].op_id == "sandbox/finalize" or any(r.op_id == "sandbox/finalize" for r in rows)
    assert local.calls("destroy") == local.calls("provision") == [state.result["sandboxId"]]
    assert sorted(local.calls("delete_snapshot")) == sorted(local.calls("snapshot"))


async def test_cancel_of_a_waiting_run_destroys_its_live_sandbox_and_snapshots(engine: durable_sandbox.Engine,
                                                                               local: Hooked) -> None:
    state = await engine.run("test-sessions-approval", {"hibernate_after": 300, "snapshot_every": 1}, run_id="cancel-wait")
    assert state.status == "waiting"
    [sandbox_id] = local.calls("provision")
    assert (local.inner.workspaces_dir / sandbox_id).is_dir(), "a waiting run below hibernate_after keeps its sandbox"
    assert len(local.inner.list_snapshots()) == 1
    state = await engine.cancel("cancel-wait", "no longer needed")
    assert state.status == "cancelled"
    assert local.calls("destroy") == [sandbox_id]
    assert state.snapshots == []
    rows = await engine.history("cancel-wait")
    assert any(r.op_id == "sandbox/finalize" and r.meta["succeeded"] is False for r in rows)


async def test_cancel_while_a_call_runs_kills_it_and_finalizes(engine: durable_sandbox.Engine, local: Hooked) -> None:
    running = asyncio.Event()

    async def signal_running(handle: SandboxHandle, call: ToolCall) -> None:
        if local.executes == 1:  # the second call: sleep 60
            running.set()

    local.before_execute = signal_running
    run_id = await engine.start("test-sessions-long-call", {}, run_id="cancel-run")
    await asyncio.wait_for(running.wait(), timeout=20)
    state = await asyncio.wait_for(engine.cancel(run_id, "stop"), timeout=20)
    assert state.status == "cancelled"
    assert local.calls("destroy") == local.calls("provision")
    assert len(local.calls("delete_snapshot")) == 1


# ------------------------------------------------------------------------------------------ crashes


async def test_a_worker_crash_mid_call_reattaches_and_reruns_only_that_call(db: Path, local: Hooked) -> None:
    calls = [{"type": "shell", "command": f"echo {i} >> trace.txt"} for i in range(4)] + [
        {"type": "read_file", "path": "trace.txt"}]
    spec = agent_spec(calls, snapshotEveryNCalls=2)
    child = run_child(db, "crashy", AGENT, spec, env={"DSB_TEST_CRASH_AFTER_EXECUTE": derived_id("crashy", 2)})
    assert child.returncode == -9, child.stderr  # SIGKILL at the fault point, after call 2 ran
    engine = engine_for(db, {"local": local})
    try:
        before = await engine.history("crashy")
        [provision] = [r for r in before if r.op_id == "sandbox/provision" and r.status == "completed"]
        sandbox_id = provision.result["id"]
        assert (local.inner.workspaces_dir / sandbox_id).is_dir(), "the crashed worker's sandbox is still there"
        assert before[-1].op_id == f"sandbox/{derived_id('crashy', 2)}" and before[-1].status == "started"
        state = await engine.resume("crashy")
        rows = await engine.history("crashy")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    # Call 2 ran twice (at least once: it had started), every other call once; same sandbox throughout.
    assert state.result["toolResults"][-1]["stdout"] == "0\n1\n2\n2\n3\n"
    assert [r["operationId"] for r in state.result["toolResults"]] == [derived_id("crashy", i) for i in range(5)]
    assert local.calls("execute") == [derived_id("crashy", i) for i in (2, 3, 4)]
    assert local.calls("provision") == [] and local.calls("restore") == []
    assert kinds(rows, "sandbox.restore") == [] and state.recovery_count == 0
    assert {r.meta["sandboxId"] for r in kinds(rows, "sandbox.call")} == {sandbox_id}
    assert state.result["sandboxId"] == sandbox_id and local.calls("destroy") == [sandbox_id]


async def test_a_worker_crash_after_a_step_reattaches_without_rerunning_calls(db: Path, local: Hooked) -> None:
    child = run_child(db, "crash-step", "test-sessions-step-between", {}, env={"DURABLE_SANDBOX_FAULT": "after:between"})
    assert child.returncode == -9, child.stderr
    engine = engine_for(db, {"local": local})
    try:
        state = await engine.resume("crash-step")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    assert state.result["trace"] == "0\n1\n2\n"
    assert local.calls("execute") == [derived_id("crash-step", 2), derived_id("crash-step", 3)]
    assert local.calls("provision") == [] and state.recovery_count == 0


@pytest.mark.parametrize("point", ["snapshot-taken", "snapshot-recorded"])
async def test_a_crash_during_snapshot_rotation_resumes_without_duplicates_or_leaks(db: Path, local: Hooked,
                                                                                   point: str) -> None:
    calls = [{"type": "shell", "command": f"echo {i} >> trace.txt"} for i in range(5)]
    spec = agent_spec(calls, snapshotEveryNCalls=2)
    child = run_child(db, "rotate-crash", AGENT, spec, env={"DURABLE_SANDBOX_FAULT": f"{point}:sandbox/snapshot/4"})
    assert child.returncode == -9, child.stderr
    assert len(local.inner.list_snapshots()) == 2, "died holding the superseded snapshot and the new one"
    engine = engine_for(db, {"local": local})
    try:
        state = await engine.resume("rotate-crash")
        rows = await engine.history("rotate-crash")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    taken = kinds(rows, "sandbox.snapshot")
    assert [r.op_id for r in taken] == ["sandbox/snapshot/2", "sandbox/snapshot/4"]
    if point == "snapshot-taken":
        # Retried with the same provider operation id: the same snapshot, not a second one.
        assert len(local.calls("snapshot")) == 1 and local.calls("snapshot")[0] == taken[1].result["snapshotId"]
    else:
        assert local.calls("snapshot") == []
    assert max(local.population) <= 2
    assert sorted(local.calls("delete_snapshot")) == sorted(r.result["snapshotId"] for r in taken)
    assert local.calls("execute") == [derived_id("rotate-crash", 4)]


# ------------------------------------------------------------------------------------------ hibernation


async def test_hibernation_at_once_leaves_only_a_snapshot_while_waiting(engine: durable_sandbox.Engine,
                                                                        local: Hooked) -> None:
    state = await engine.run("test-sessions-approval", {"hibernate_after": 0}, run_id="hib")
    assert state.status == "waiting" and [p.id for p in state.pending_callbacks] == ["approve"]
    [snapshot] = local.inner.list_snapshots()
    assert local.inner.leftovers() == [local.inner.snapshots_dir / f"{snapshot}.tar"], "no live sandbox, no lease"
    rows = await engine.history("hib")
    assert [r.meta["reason"] for r in kinds(rows, "sandbox.destroy") if r.meta.get("reason")] == ["hibernate"]
    await engine.signal("hib", "approve", {"ok": True})
    state = await engine.resume("hib")
    assert state.status == "succeeded", state.error
    assert state.result["verdict"] == {"ok": True}
    assert state.result["out"] == "alpha\nbeta\ngamma\nexecutable\n", "files and modes survived hibernation"
    rows = await engine.history("hib")
    [restore] = kinds(rows, "sandbox.restore")
    assert restore.meta["reason"] == "resume" and restore.meta["snapshotId"] == snapshot
    assert state.recovery_count == 0, "waking up is not a recovery"
    assert len(local.calls("execute")) == 3, "no call ran twice"


async def test_loss_during_snapshot_rotation_restores_the_checkpoint_and_retries_the_same_snapshot(
        engine: durable_sandbox.Engine, local: Hooked) -> None:
    operations: list[str] = []

    async def lose_at_second_snapshot(handle: SandboxHandle, operation_id: str) -> None:
        operations.append(operation_id)
        if len(operations) == 2:
            await local.inner.inject_loss(handle)

    local.before_snapshot = lose_at_second_snapshot
    state = await engine.run(AGENT, agent_spec(CALLS, snapshotEveryNCalls=2), run_id="rot-loss")
    assert state.status == "succeeded", state.error
    assert results(state) == EXPECTED and state.recovery_count == 1
    assert operations[1] == operations[2], "the snapshot is retried with the same provider operation id"
    rows = await engine.history("rot-loss")
    taken = kinds(rows, "sandbox.snapshot")
    assert [r.op_id for r in taken] == ["sandbox/snapshot/2", "sandbox/snapshot/4"]
    [restore] = kinds(rows, "sandbox.restore")
    assert restore.meta["snapshotId"] == taken[0].result["snapshotId"], "restored from the current checkpoint"
    assert restore.meta["replayed"] == [f"sandbox/{derived_id('rot-loss', i)}" for i in (2, 3)]
    assert journal_index(rows, "sandbox/snapshot/4", "completed") < journal_index(rows, "sandbox/snapshot/2/delete", "started")
    assert len(local.calls("snapshot")) == 2 and max(local.population) <= 2


async def resume_here(db: Path, local: Hooked, run_id: str) -> tuple[durable_sandbox.RunState, list[OperationRecord]]:
    """Resume, in this process, a run whose child process died; its state and journal."""
    engine = engine_for(db, {"local": local})
    try:
        return await engine.resume(run_id), await engine.history(run_id)
    finally:
        await engine.aclose()


async def test_a_worker_crash_during_recovery_finishes_it_without_leaking_the_half_built_sandbox(
        db: Path, local: Hooked) -> None:
    spec = agent_spec(CALLS, snapshotEveryNCalls=2, injectLossAfterNCalls=3)
    # Call 2 runs, the loss is injected, the replacement is restored and call 2 is replayed into it: die there.
    child = run_child(db, "crash-recovery", AGENT, spec,
                      env={"DSB_TEST_CRASH_AFTER_EXECUTE": derived_id("crash-recovery", 2) + "@2"})
    assert child.returncode == -9, child.stderr
    assert len([p for p in local.inner.workspaces_dir.iterdir()]) == 1, "the half-built replacement"
    state, rows = await resume_here(db, local, "crash-recovery")
    assert state.status == "succeeded", state.error
    assert results(state) == EXPECTED
    assert state.result["recoveryCount"] == 1 == state.recovery_count, "still one recovery, finished after the crash"
    abandoned = [r.meta["sandboxId"] for r in kinds(rows, "sandbox.destroy") if r.meta.get("reason") == "abandoned"]
    assert len(abandoned) == 1 and abandoned[0] in local.calls("destroy")


async def test_a_worker_crash_between_provisioning_and_journaling_leaks_nothing(db: Path, local: Hooked) -> None:
    child = run_child(db, "crash-provision", AGENT, agent_spec(CALLS[:2]), env={"DSB_TEST_CRASH_AFTER_PROVISION": "1"})
    assert child.returncode == -9, child.stderr
    [orphan] = list(local.inner.workspaces_dir.iterdir())  # made by the provider, unknown to the journal
    state, _ = await resume_here(db, local, "crash-provision")
    assert state.status == "succeeded", state.error
    assert orphan.name in local.calls("destroy"), "found by its run/session labels and destroyed"


async def test_a_worker_crash_between_restoring_and_journaling_the_replacement_leaks_nothing(
        db: Path, local: Hooked) -> None:
    # The loss after call 3 is recovered from the snapshot after call 2: die once the provider has made the
    # replacement, before the journal names it (a replica that loses its lease mid-restore leaves the same).
    spec = agent_spec(CALLS, snapshotEveryNCalls=2, injectLossAfterNCalls=3)
    child = run_child(db, "crash-restore", AGENT, spec,
                      env={"DURABLE_SANDBOX_FAULT": "provisioned:sandbox/restore/1"})
    assert child.returncode == -9, child.stderr
    [orphan] = list(local.inner.workspaces_dir.iterdir())  # the replacement; the lost sandbox was destroyed
    state, rows = await resume_here(db, local, "crash-restore")
    assert state.status == "succeeded", state.error
    assert results(state) == EXPECTED
    assert orphan.name in local.calls("destroy"), "found by its run/session labels and destroyed"
    restored = [r.result["id"] for r in kinds(rows, "sandbox.restore") if r.status == "completed"]
    assert orphan.name not in restored, "a second replacement was made and journaled instead"
    assert not list(local.inner.workspaces_dir.iterdir())


async def test_a_sandbox_made_for_the_session_behind_the_journals_back_is_destroyed_when_the_session_ends(
        engine: durable_sandbox.Engine, local: Hooked) -> None:
    # What an executor that lost the run's lease leaves when its create lands after the run was taken over:
    # a sandbox labelled with this run and session that no journal row names. Another run's is left alone.
    specs: list[SandboxSpec] = []
    inner_provision = local.inner.provision

    async def recording(spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        specs.append(spec)
        return await inner_provision(spec, lease_seconds=lease_seconds)

    local.inner.provision = recording  # type: ignore[method-assign]
    strays: list[SandboxHandle] = []

    async def zombie_create(handle: SandboxHandle, call: ToolCall) -> None:
        if not strays:
            mine = specs[0].model_copy(update={"operation_id": "zombie"})
            theirs = mine.model_copy(update={"labels": {**mine.labels, "durable-sandbox.dev/run-id": "another-run"}})
            strays.extend([await inner_provision(mine, lease_seconds=60), await inner_provision(theirs, lease_seconds=60)])

    local.before_execute = zombie_create
    state = await engine.run(AGENT, agent_spec(CALLS[:2]), run_id="zombie-create")
    assert state.status == "succeeded", state.error
    mine, theirs = strays
    assert mine.id in local.calls("destroy"), "the stray of this run's session was left live"
    assert theirs.id not in local.calls("destroy"), "another run's sandbox was destroyed"
    await local.inner.destroy(theirs)


@pytest.mark.parametrize("kill", ["DSB_TEST_CRASH_IN_SNAPSHOT_WRITE", "DSB_TEST_CRASH_IN_TRASH"])
async def test_a_kill_while_writing_a_snapshot_or_deleting_a_sandbox_leaves_no_temp_or_trash(
        db: Path, home: Path, local: Hooked, kill: str) -> None:
    child = run_child(db, "half-done", AGENT, agent_spec(CALLS, snapshotEveryNCalls=2), env={kill: "1"})
    assert child.returncode == -9, child.stderr
    left = [p for d in local.inner.directories() for p in d.iterdir() if p.name.startswith(".")]
    assert left and all(p.name.endswith(".tmp") or p.name.startswith(".trash-") for p in left), left
    engine = engine_for(db, {"local": Hooked(LocalProvider(home))})  # a provider starting: it sweeps
    try:
        state = await engine.resume("half-done")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    assert results(state) == EXPECTED
    # The fixture's teardown checks that the directories hold nothing at all: temp and trash files included.


async def test_the_journal_keeps_the_first_and_last_64_kib_of_a_big_output(engine: durable_sandbox.Engine,
                                                                            db: Path) -> None:
    size = 8 * 1024 * 1024
    calls = [{"type": "shell", "command": f"head -c {size} /dev/zero | tr '\\0' x; echo; echo done"}]
    state = await engine.run(AGENT, agent_spec(calls), run_id="big")
    assert state.status == "succeeded", state.error
    [result] = state.result["toolResults"]
    assert result["stdoutBytes"] == size + 6 and "output truncated" in result["stdout"]
    assert result["stdout"].endswith("x\ndone\n") and len(result["stdout"]) < 140_000
    [row] = [r for r in await engine.history("big") if r.kind == "sandbox.call" and r.status == "completed"]
    assert row.result == {k: v for k, v in result.items() if k != "operationId"}
    assert _store_bytes(db) < 2 * 1024 * 1024, "the store stays small"


def _store_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, Path(str(db) + "-wal")) if p.exists())
