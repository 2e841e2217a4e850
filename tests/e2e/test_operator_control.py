"""Acceptance 5: signals, suspend and cancel by editing the spec; the watch brings each to the running run.

Calls that must be in flight at a chosen moment block on a gate file the test creates (the local provider
runs commands on this machine), so nothing here depends on timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.dsb import dsb
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    condition,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_event,
    wait_in_flight,
)

__all__ = ["namespace", "operators"]  # fixtures

# CI runs these under the PostgreSQL journal too: once per journal (tests/e2e/journal_support.py).
pytestmark = pytest.mark.both_journals


def gated_calls(gate: Path, *, after: int = 2) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = [
        {"type": "write_file", "path": "notes/a.txt", "contents": "kept across hibernation\n"},
        {"type": "shell", "command": "echo one >> notes/log.txt"},
    ][:after]
    calls += [
        {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo gate passed"},
        {"type": "read_file", "path": "notes/a.txt"},
        {"type": "shell", "command": "cat notes/log.txt"},
    ]
    return calls


def test_callback_workflow_waits_and_is_resumed_by_kubectl_patch_or_dsb_kube_signal(
    control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    """Both ways of answering a WaitingForSignal Workflow: `kubectl patch` of spec.signals, and `dsb --kube
    signal` (which writes the same field); one operator serves the two Workflows."""
    operators("--allow-local-provider", "--workflows", "examples.flows")
    for name in ("approve-me", "approve-cli"):
        doc = manifest(name, entrypoint="examples.flows.hello_flow:hello", input={"name": "Ada", "approve": True},
                       toolCalls=None, sandbox=None, snapshotEveryNCalls=None)
        control_plane.apply(doc, "-n", namespace)
    wait_condition(control_plane, namespace, "approve-me", "WaitingForSignal")
    st = status(control_plane, namespace, "approve-me")
    assert st["phase"] == "Waiting"
    assert st["pendingCallbacks"] == [{"id": "approval", "payload": {"question": "Send 'Hello, Ada!'?"}}]
    wait_event(control_plane, namespace, "approve-me", "WaitingForSignal")

    control_plane.kubectl("patch", "workflow", "approve-me", "-n", namespace, "--type", "merge",
                          "-p", json.dumps({"spec": {"signals": {"approval": {"approved": True, "by": "grace"}}}}))
    wait_condition(control_plane, namespace, "approve-me", "Succeeded")
    st = status(control_plane, namespace, "approve-me")
    assert st["result"]["approval"] == {"approved": True, "by": "grace"}
    assert st["result"]["greeting"] == "Hello, Ada!"
    assert condition(control_plane, namespace, "approve-me", "WaitingForSignal")["status"] == "False"  # type: ignore[index]

    # The same run answered with `dsb --kube signal` (#10 acceptance 5): waiting, then resumed by it.
    wait_condition(control_plane, namespace, "approve-cli", "WaitingForSignal")
    proc = dsb("--kube", "-n", namespace, "signal", "approve-cli", "approval", '{"approved": true, "by": "dsb"}', process=True)
    assert proc.returncode == 0, proc.stderr
    assert "signalled approval of run approve-cli" in proc.stdout
    wait_condition(control_plane, namespace, "approve-cli", "Succeeded")
    result = status(control_plane, namespace, "approve-cli")["result"]
    assert result["approval"] == {"approved": True, "by": "dsb"}
    assert result["greeting"] == "Hello, Ada!"


def test_suspend_hibernates_between_calls_and_resume_restores_from_the_snapshot(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    op = operators("--allow-local-provider")
    gate = tmp_path / "gate"
    doc = manifest("pausable", toolCalls=gated_calls(gate), snapshotEveryNCalls=0)
    control_plane.apply(doc, "-n", namespace)
    # The third call blocks on the gate: two calls completed, one in flight.
    wait_in_flight(control_plane, namespace, "pausable", 2)
    patched = control_plane.kubectl_json("patch", "workflow", "pausable", "-n", namespace, "--type", "merge",
                                         "-p", '{"spec":{"suspend":true}}')
    # The replica executing the run says it has seen the suspend while the call is still in flight; only
    # then does the call end (a suspend takes effect at the next call boundary after it is seen).
    generation = patched["metadata"]["generation"]
    wait_until(lambda: status(control_plane, namespace, "pausable").get("observedGeneration") == generation, 60,
               f"status.observedGeneration of the running Workflow to reach {generation}")
    st = status(control_plane, namespace, "pausable")
    assert (st["phase"], st["currentCall"]["index"]) == ("Running", 2), st
    gate.touch()  # the call in flight completes; the run stops at the next boundary
    wait_condition(control_plane, namespace, "pausable", "Suspended")
    st = status(control_plane, namespace, "pausable")
    assert st["phase"] == "Suspended"
    assert st["calls"]["completed"] == 3
    live = [s for s in local_sandboxes(op.home) if s.startswith("local/workspaces/")]
    assert live == [], live  # hibernated: no live sandbox while suspended
    assert any(s.startswith("local/snapshots/") for s in local_sandboxes(op.home))
    wait_event(control_plane, namespace, "pausable", "Suspended")

    control_plane.kubectl("patch", "workflow", "pausable", "-n", namespace, "--type", "merge",
                          "-p", '{"spec":{"suspend":false}}')
    wait_condition(control_plane, namespace, "pausable", "Succeeded")
    results = status(control_plane, namespace, "pausable")["result"]["toolResults"]
    assert [r["stdout"] for r in results[-3:]] == ["gate passed\n", "kept across hibernation\n", "one\n"]
    wait_event(control_plane, namespace, "pausable", "Resumed")  # Events are written in the background
    assert local_sandboxes(op.home) == []


def test_cancel_stops_the_run_and_cleans_up(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    op = operators("--allow-local-provider")
    gate = tmp_path / "never"
    control_plane.apply(manifest("stop-me", toolCalls=gated_calls(gate), snapshotEveryNCalls=2), "-n", namespace)
    wait_in_flight(control_plane, namespace, "stop-me", 2)
    control_plane.kubectl("patch", "workflow", "stop-me", "-n", namespace, "--type", "merge", "-p", '{"spec":{"cancel":true}}')
    wait_until(lambda: status(control_plane, namespace, "stop-me").get("phase") == "Cancelled", 90, "phase Cancelled")
    failed = condition(control_plane, namespace, "stop-me", "Failed")
    assert failed is not None and failed["status"] == "True" and failed["reason"] == "Cancelled"
    assert "spec.cancel" in failed["message"]
    wait_event(control_plane, namespace, "stop-me", "Cancelled")
    assert local_sandboxes(op.home) == []
