"""A change to a finished Workflow is said, not silently dropped: a signal, suspend or cancel patch on a
Succeeded Workflow gets a Warning Event and a Ready reason naming the field, with what to do instead; adding
spec.retry to a Failed Workflow retries it in place (what the docs give as the way to retry one), and `dsb
--kube resume` of a finished Workflow says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.dsb import dsb
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    condition,
    events,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
)

__all__ = ["namespace", "operators"]  # fixtures


def _patch(cp: ControlPlane, ns: str, name: str, spec: dict[str, Any]) -> None:
    cp.kubectl("patch", "workflow", name, "-n", ns, "--type", "merge", "-p", json.dumps({"spec": spec}))


def _ready_reason(cp: ControlPlane, ns: str, name: str, reason: str) -> dict[str, Any]:
    def said() -> dict[str, Any] | None:
        ready = condition(cp, ns, name, "Ready")
        return ready if ready is not None and ready["reason"] == reason else None

    try:
        return wait_until(said, 60, f"Ready reason {reason} on {ns}/{name}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; status: {status(cp, ns, name)}") from None


def test_changes_to_a_finished_workflow_are_said(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    cp, ns = control_plane, namespace
    operators("--allow-local-provider")
    cp.apply(manifest("done", snapshotEveryNCalls=0, toolCalls=[{"type": "shell", "command": "echo hi"}]), "-n", ns)
    wait_condition(cp, ns, "done", "Succeeded")

    # Each patch adds to the last (a signal cannot be taken back): the reason names the first field the spec
    # asks for in vain, in the order cancel, suspend, signals.
    for spec, reason, field in (({"signals": {"approve": True}}, "SignalIgnored", "spec.signals.approve"),
                                ({"suspend": True}, "SuspendIgnored", "spec.suspend"),
                                ({"cancel": True}, "CancelIgnored", "spec.cancel")):
        _patch(cp, ns, "done", spec)
        ready = _ready_reason(cp, ns, "done", reason)
        assert ready["status"] == "False" and ready["message"].startswith(field), ready
        assert "changed (generation " in ready["message"]
        assert "after the run succeeded" in ready["message"] and "kubectl replace --force" in ready["message"]
        wait_until(lambda reason=reason: any(e["reason"] == reason and e["type"] == "Warning"
                                             for e in events(cp, ns, "done")), 60, f"a {reason} Event")
    st = status(cp, ns, "done")
    assert st["phase"] == "Succeeded" and condition(cp, ns, "done", "Succeeded")["status"] == "True"  # type: ignore[index]

    monkeypatch.setenv("KUBECONFIG", str(cp.kubeconfig))
    resumed = dsb("--kube", "-n", ns, "resume", "done", process=True)
    assert resumed.returncode == 2 and "Workflow done is succeeded" in resumed.stderr, resumed.stderr
    assert "kubectl replace --force" in resumed.stderr and "spec.retry" in resumed.stderr

    # The way to retry a failed Workflow in place: add spec.retry.
    marker = tmp_path / "failed-once"
    cp.apply(manifest("broken", snapshotEveryNCalls=0, toolCalls=[
        {"type": "shell", "command": f"if [ -e {marker} ]; then echo fixed; else touch {marker}; exit 3; fi",
         "failurePolicy": {"onNonZeroExit": "fail"}}]), "-n", ns)
    wait_condition(cp, ns, "broken", "Failed")
    _patch(cp, ns, "broken", {"retry": {"maxAttempts": 2, "initialIntervalSeconds": 0}})
    wait_condition(cp, ns, "broken", "Succeeded")
    assert status(cp, ns, "broken")["attempt"] == 2
