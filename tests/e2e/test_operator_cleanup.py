"""Acceptance 4 (second part): while the provider refuses cleanup, the finalizer stays, condition
CleanupBlocked and an Event say why, and cleanup completes once the provider recovers. The provider is e2b
against the fake E2B server (its documented HTTP protocol, real commands in temp workspaces) running in
this process, so the test can switch its DELETEs to failing and back. The sandbox's env comes from a
Secret, which must reach the sandbox and nothing else (status, Events, operator logs)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    condition,
    events,
    fake_e2b,
    get,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_in_flight,
)
from tests.fakes.e2b_state import FakeState

__all__ = ["fake_e2b", "namespace", "operators"]  # fixtures

SECRET_VALUE = "tok-" + "9f3a61c2e8d04b7f"


def test_cleanup_blocked_while_the_provider_refuses_then_completes(
    fake_e2b: FakeState, control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    # fake_e2b first: it is torn down last, after the operators that stream from it have stopped.
    cp = control_plane
    cp.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tokens"},
              "data": {"token": base64.b64encode(SECRET_VALUE.encode()).decode()}}, "-n", namespace)
    # Cleanup gives up after 2 tries of 2 requests each (--cleanup-attempts, E2B_RETRY_ATTEMPTS; by default 8 of 5,
    # about 80 s of backoff): what is checked is that a refusal blocks cleanup and that it finishes afterwards.
    op = operators("--cleanup-attempts", "2",
                   env={"E2B_API_KEY": fake_e2b.api_key, "E2B_API_URL": fake_e2b.api_url,
                        "E2B_SANDBOX_URL": fake_e2b.sandbox_url, "E2B_RETRY_ATTEMPTS": "2"})
    gate = tmp_path / "never"
    doc = {
        "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": "stubborn"},
        "spec": {
            "sandbox": {"provider": "e2b", "template": "base",
                        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tokens", "key": "token"}}}]},
            "snapshotEveryNCalls": 1,
            "toolCalls": [
                {"type": "shell", "command": 'test "$TOKEN" = ' + SECRET_VALUE + " && echo token-ok"},
                {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done"},
            ],
        },
    }
    cp.apply(doc, "-n", namespace)
    try:
        _blocked_then_cleaned(cp, namespace, fake_e2b, op)
    finally:
        gate.touch()  # the fake E2B does not kill a deleted sandbox's commands: let this one end


def _blocked_then_cleaned(cp: ControlPlane, namespace: str, fake_e2b: FakeState, op: Any) -> None:
    wait_in_flight(cp, namespace, "stubborn", 1)
    calls = [o for o in status(cp, namespace, "stubborn")["recentOperations"] if o["kind"] == "sandbox.call"]
    assert calls[0]["exitCode"] == 0  # the Secret's value reached the sandbox
    assert fake_e2b.live_sandboxes() and fake_e2b.snapshots()

    fake_e2b.fail_deletes(503)
    cp.kubectl("delete", "workflow", "stubborn", "-n", namespace, "--wait=false")

    def blocked() -> dict[str, Any] | None:
        cond = condition(cp, namespace, "stubborn", "CleanupBlocked")
        return cond if cond is not None and cond["status"] == "True" else None

    cond = wait_until(blocked, 180, "condition CleanupBlocked")
    assert "503" in cond["message"] or "injected" in cond["message"]
    wait_until(lambda: any(e["reason"] == "CleanupBlocked" and e["type"] == "Warning" for e in events(cp, namespace, "stubborn")),
               60, "a CleanupBlocked event")
    obj = get(cp, namespace, "stubborn")
    assert obj is not None and "durable-sandbox.dev/cleanup" in obj["metadata"]["finalizers"]
    assert fake_e2b.live_sandboxes() or fake_e2b.snapshots()  # nothing was dropped silently

    fake_e2b.allow_deletes()
    wait_until(lambda: get(cp, namespace, "stubborn") is None, 180, "the Workflow to be deleted once cleanup succeeds")
    assert fake_e2b.live_sandboxes() == []
    assert fake_e2b.snapshots() == []

    # The Secret's value reached the sandbox and nothing else.
    assert SECRET_VALUE not in op.logs()
    assert SECRET_VALUE not in json.dumps(cp.kubectl_json("get", "events", "-n", namespace))


# CI runs this one under the PostgreSQL journal too (tests/e2e/journal_support.py); the CleanupBlocked test above
# is run on that journal by the full suite's command only.
@pytest.mark.both_journals
def test_deleting_a_workflow_deletes_its_retained_snapshot_whatever_its_status_shows(
    control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    """A succeeded run's retained snapshot (retainLatestSnapshot) goes with its Workflow. The finalizer finds
    it in the journal, not in status.latestSnapshot: status is a projection, and a replica that did not
    execute the run's end could write it from fewer rows (the chaos soak, seed 18, left a snapshot so). Here
    status is made to show what such a replica wrote: an older snapshot as the latest."""
    cp = control_plane
    op = operators("--allow-local-provider")
    cp.apply(manifest("keeper", snapshotEveryNCalls=1, retainLatestSnapshot=True), "-n", namespace)
    wait_condition(cp, namespace, "keeper", "Succeeded")
    kept = status(cp, namespace, "keeper")["latestSnapshot"]
    assert kept and local_sandboxes(op.home) == [f"local/snapshots/{kept}.tar"]  # retained, nothing else left

    stale = "local-snapshot-of-an-earlier-call"
    cp.kubectl("patch", "workflow", "keeper", "-n", namespace, "--subresource=status", "--type", "merge",
               "-p", json.dumps({"status": {"latestSnapshot": stale}}))
    assert status(cp, namespace, "keeper")["latestSnapshot"] == stale
    cp.kubectl("delete", "workflow", "keeper", "-n", namespace, "--wait=false")
    wait_until(lambda: get(cp, namespace, "keeper") is None, 120, "the Workflow to be deleted")
    assert local_sandboxes(op.home) == []
