"""Acceptance 8 (the operator's part): what admission cannot check is rejected by the operator with a
Failed condition and an Event, and nothing runs or is imported: an unknown provider, the local provider
when it is not allowed, an entrypoint outside the configured workflow modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    condition,
    event_reasons,
    events,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
)

__all__ = ["namespace", "operators"]  # fixtures


def _rejected(cp: ControlPlane, ns: str, name: str, reason: str) -> dict[str, Any]:
    def failed() -> dict[str, Any] | None:
        cond = condition(cp, ns, name, "Failed")
        return cond if cond is not None and cond["status"] == "True" else None

    cond = wait_until(failed, 60, f"{name} to be rejected")
    assert cond["reason"] == reason, cond
    assert status(cp, ns, name)["phase"] == "Failed"
    wait_until(lambda: reason in event_reasons(cp, ns, name), 30, f"a {reason} event on {name}")
    warning = next(e for e in events(cp, ns, name) if e["reason"] == reason)
    assert warning["type"] == "Warning" and warning["message"] == cond["message"]
    return cond


def test_operator_rejects_what_admission_cannot_check_and_runs_nothing(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "imported"
    op = operators("--workflows", "examples.flows", env={"DSB_IMPORT_MARKER": str(marker)})
    cp = control_plane
    cp.apply(manifest("local-refused"), "-n", namespace)
    cp.apply(manifest("no-such-provider", sandbox={"provider": "nosuch"}), "-n", namespace)
    cp.apply(manifest("not-allowed", toolCalls=None, sandbox=None, snapshotEveryNCalls=None,
                      entrypoint="tests.e2e.import_marker:flow", input={"a": 1}), "-n", namespace)

    cond = _rejected(cp, namespace, "local-refused", "ProviderNotAllowed")
    assert "spec.sandbox.provider" in cond["message"] and "--allow-local-provider" in cond["message"]
    cond = _rejected(cp, namespace, "no-such-provider", "UnknownProvider")
    assert "spec.sandbox.provider" in cond["message"] and "nosuch" in cond["message"]
    cond = _rejected(cp, namespace, "not-allowed", "WorkflowNotAllowed")
    assert "spec.entrypoint" in cond["message"] and "examples.flows" in cond["message"]

    assert not marker.exists(), "the operator imported a module it was not configured with"
    assert local_sandboxes(op.home) == []
    # Nothing ran: no run objects (journal heads, leases) exist for any of them.
    assert cp.kubectl_json("get", "journals", "-n", namespace, "-l", "durable-sandbox.dev/run-id")["items"] == []
