"""Issue 27 item 3, idle Sandboxes cost nothing: ``spec.idleSuspendAfterSeconds``.

- The example (examples/idle-sandbox.yaml, then examples/idle-sandbox-resume.yaml): a Sandbox nobody holds for
  that long is suspended (snapshot taken, live sandbox gone, ``IdleSuspended``, State Suspended); the next
  Workflow with ``sandboxRef`` resumes it (``Resumed``) and finds the first one's file.
- The races, each side first, stopped at a fault point (``DURABLE_SANDBOX_PAUSE``, engine/faults.py), not timed:
  a Workflow that comes while the idle timer suspends waits, runs no call on the half-suspended sandbox, then runs
  on the resumed one; a Workflow that takes the Sandbox while the idle timer is due keeps it, mid-call, and the
  timer suspends it only after that Workflow let go.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from durable_sandbox.providers.contract import SandboxHandle, ToolCall
from durable_sandbox.providers.local import LocalProvider
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    ROOT,
    OperatorProcess,
    condition,
    event_reasons,
    local_sandboxes,
    log_records,
    manifest,
    namespace,
    operators,
    wait_in_flight,
)
from tests.e2e.operator_support import status as workflow_status
from tests.e2e.operator_support import wait_condition as wait_workflow
from tests.e2e.sandbox_support import get, sandbox, status, wait_for

__all__ = ["namespace", "operators"]  # fixtures

EXAMPLE = ROOT / "examples" / "idle-sandbox.yaml"
RESUME = ROOT / "examples" / "idle-sandbox-resume.yaml"
KEPT = "written before the idle suspend\n"


def start(operators: Any, *, pause: tuple[str, Path] | None = None) -> OperatorProcess:
    env = {"DURABLE_SANDBOX_PAUSE": f"{pause[0]}={pause[1]}"} if pause else {}
    op: OperatorProcess = operators("--allow-local-provider", env=env)
    return op


def workspaces(home: Path) -> list[str]:
    return [s.split("/")[-1] for s in local_sandboxes(home) if s.startswith("local/workspaces/")]


def snapshots(home: Path) -> list[str]:
    return [s.split("/")[-1].removesuffix(".tar") for s in local_sandboxes(home) if s.startswith("local/snapshots/")]


def cond(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in st.get("conditions") or [] if c["type"] == ctype)


def write_in(home: Path, provider_id: str, path: str, contents: str) -> None:
    """A file written into the Sandbox's live sandbox through the provider's API (no Workflow: no activity)."""
    async def go() -> int:
        result = await LocalProvider(home=home).execute(
            SandboxHandle(id=provider_id, provider="local"),
            ToolCall(operation_id=f"test-write-{path}", type="write_file", args={"path": path, "contents": contents}))
        return result.exit_code

    assert asyncio.run(go()) == 0


def reader(name: str, box: str, path: str) -> dict[str, Any]:
    return manifest(name, toolCalls=[{"type": "read_file", "path": path}], sandbox=None, sandboxRef={"name": box},
                    snapshotEveryNCalls=None)


def idle_suspended(cp: ControlPlane, ns: str, name: str, home: Path) -> dict[str, Any]:
    """Wait until Sandbox ``name`` is suspended for idleness; check what it says and what the provider holds."""
    st = wait_for(cp, ns, name, "Suspended")
    assert cond(st, "Suspended")["reason"] == "IdleTimeout", st
    assert cond(st, "Ready")["reason"] == "IdleSuspended" and cond(st, "Ready")["status"] == "False"
    assert st["phase"] == "Suspended" and st["state"] == "Suspended" and st["stateSince"]
    assert not st.get("providerId") and workspaces(home) == []
    assert len(st["snapshots"]) == 1 and snapshots(home) == st["snapshots"]
    return st


def lifecycle_lines(op: OperatorProcess, ns: str, name: str) -> list[str]:
    prefix = f"{ns}/{name} (Sandbox): "
    return [str(r["message"]).removeprefix(prefix) for r in log_records(op.logs())
            if r.get("logger") == "durable_sandbox.kube.lifecycle" and str(r.get("message", "")).startswith(prefix)]


def test_the_example_an_idle_sandbox_is_suspended_and_the_next_workflow_resumes_it(
        control_plane: ControlPlane, namespace: str, operators: Any) -> None:
    cp, ns = control_plane, namespace
    op = start(operators)
    cp.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
    wait_workflow(cp, ns, "fill-idle-box", "Succeeded")
    first = workflow_status(cp, ns, "fill-idle-box")["result"]["sandboxId"]

    st = idle_suspended(cp, ns, "idle-box", op.home)
    assert "5s" in cond(st, "Suspended")["message"] and st["snapshots"][0] in cond(st, "Suspended")["message"]
    table = cp.kubectl("get", "dsbx", "idle-box", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PROVIDER", "READY", "STATE", "SINCE", "AGE"], table
    assert table[1].split()[:5] == ["idle-box", "Suspended", "local", "False", "Suspended"], table
    reasons = event_reasons(cp, ns, "idle-box")
    assert reasons.index("SnapshotTaken") < reasons.index("IdleSuspended"), reasons

    # The next Workflow takes it, which resumes it from the snapshot; its call finds the first one's file.
    cp.kubectl("apply", "-n", ns, "-f", str(RESUME))
    wait_workflow(cp, ns, "read-idle-box", "Succeeded")
    result = workflow_status(cp, ns, "read-idle-box")["result"]
    assert result["toolResults"][0]["stdout"] == KEPT
    assert result["sandboxId"] != first  # a new live sandbox, restored from the snapshot
    reasons = event_reasons(cp, ns, "idle-box")
    assert reasons.index("IdleSuspended") < reasons.index("Resumed"), reasons
    lines = lifecycle_lines(op, ns, "idle-box")
    assert any(line.startswith("IdleSuspended: no call for 5s") for line in lines), lines
    assert any(line.startswith("Resumed: ") and "for Workflow read-idle-box" in line for line in lines), lines

    # Unheld again, it is idle, then suspended again: it costs nothing until the next Workflow.
    idle_suspended(cp, ns, "idle-box", op.home)
    cp.kubectl("delete", "-n", ns, "-f", str(EXAMPLE), "-f", str(RESUME), "--wait=false")
    wait_until(lambda: get(cp, ns, "idle-box") is None, 90, "the Sandbox to be deleted")
    assert local_sandboxes(op.home) == []
    op.check_log()


def test_a_workflow_that_comes_while_the_idle_timer_suspends_waits_then_runs_on_the_resumed_sandbox(
        control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> None:
    cp, ns = control_plane, namespace
    gate = tmp_path / "claimed"
    op = start(operators, pause=("idle:claimed", gate))
    cp.apply(sandbox("racy", idleSuspendAfterSeconds=2), "-n", ns)
    live = wait_for(cp, ns, "racy", "Ready")["providerId"]
    write_in(op.home, live, "notes/kept.txt", KEPT)
    wait_until(lambda: Path(f"{gate}.reached").exists(), 60, "the idle timer to claim the Sandbox")

    # Half suspended: the idle timer holds it, the sandbox is still live. A Workflow now waits, no call runs.
    assert status(cp, ns, "racy")["phase"] == "Suspending" and workspaces(op.home) == [live]
    cp.apply(reader("late", "racy", "notes/kept.txt"), "-n", ns)

    def waiting() -> dict[str, Any] | None:
        ready = condition(cp, ns, "late", "Ready")
        return ready if ready and ready["reason"] == "WaitingForSandbox" else None

    ready = wait_until(waiting, 60, "the Workflow to wait for the Sandbox")
    assert "being suspended" in ready["message"], ready
    st = workflow_status(cp, ns, "late")
    assert not st.get("currentCall") and (st.get("calls") or {}).get("completed", 0) == 0, st
    assert workspaces(op.home) == [live] and not status(cp, ns, "racy").get("holder")

    gate.touch()  # the suspend goes on; then the Workflow takes the Sandbox, which resumes it
    wait_workflow(cp, ns, "late", "Succeeded")
    result = workflow_status(cp, ns, "late")["result"]
    assert result["toolResults"][0]["stdout"] == KEPT and result["sandboxId"] != live
    reasons = event_reasons(cp, ns, "racy")
    assert reasons.index("SnapshotTaken") < reasons.index("IdleSuspended") < reasons.index("Resumed"), reasons
    assert live not in workspaces(op.home)
    op.check_log()


def test_a_workflow_that_takes_the_sandbox_while_the_idle_timer_is_due_keeps_it_mid_call(
        control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> None:
    cp, ns = control_plane, namespace
    due, call_gate = tmp_path / "due", tmp_path / "call-gate"
    op = start(operators, pause=("idle:due", due))
    cp.apply(sandbox("busy", idleSuspendAfterSeconds=2), "-n", ns)
    live = wait_for(cp, ns, "busy", "Ready")["providerId"]
    wait_until(lambda: Path(f"{due}.reached").exists(), 60, "the idle timer to be due")

    # The timer is due but has not claimed the Sandbox: a Workflow takes it and is mid-call.
    calls = [{"type": "write_file", "path": "notes/kept.txt", "contents": KEPT},
             {"type": "shell", "command": f"while [ ! -e {call_gate} ]; do sleep 0.05; done; cat notes/kept.txt"}]
    cp.apply(manifest("holder", toolCalls=calls, sandbox=None, sandboxRef={"name": "busy"}, snapshotEveryNCalls=None),
             "-n", ns)
    wait_in_flight(cp, ns, "holder", 1)
    due.touch()  # the timer goes on: its claim must fail, and the sandbox stay live under the call
    wait_until(lambda: "the idle timer was due, but a Workflow took" in op.logs(), 60, "the idle claim to fail")
    st = status(cp, ns, "busy")
    assert st["phase"] == "Ready" and st["providerId"] == live and workspaces(op.home) == [live], st
    wait_until(lambda: status(cp, ns, "busy").get("state") == "Ready", 30, "the Sandbox to show it is held")
    assert "IdleSuspended" not in event_reasons(cp, ns, "busy")

    call_gate.touch()
    wait_workflow(cp, ns, "holder", "Succeeded")
    assert workflow_status(cp, ns, "holder")["result"]["toolResults"][1]["stdout"] == KEPT
    # Let go, it is idle from then on, and suspended once the timer runs out again.
    st = idle_suspended(cp, ns, "busy", op.home)
    assert st["snapshots"] and live not in workspaces(op.home)
    cp.apply(reader("after", "busy", "notes/kept.txt"), "-n", ns)
    wait_workflow(cp, ns, "after", "Succeeded")
    assert workflow_status(cp, ns, "after")["result"]["toolResults"][0]["stdout"] == KEPT
    op.check_log()
