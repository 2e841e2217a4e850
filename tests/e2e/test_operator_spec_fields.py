"""Spec fields that only mean something in the cluster, honoured by the operator: timeoutSeconds (the run
is cancelled and cleaned up), retry (a failed run is retried, completed calls kept) and
ttlSecondsAfterFinished (a finished Workflow is deleted, as a Job's TTL does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    condition,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_gone,
)

__all__ = ["namespace", "operators"]  # fixtures


def test_timeout_retry_and_ttl_in_the_cluster(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    cp = control_plane
    op = operators("--allow-local-provider")
    never = tmp_path / "never"
    cp.apply(manifest("slow", snapshotEveryNCalls=0, timeoutSeconds=3,
                      toolCalls=[{"type": "shell", "command": f"while [ ! -e {never} ]; do sleep 0.05; done"}]),
             "-n", namespace)
    marker = tmp_path / "first-attempt-done"
    flaky = [
        {"type": "shell", "command": "echo before"},
        {"type": "shell", "command": f"if [ -e {marker} ]; then echo recovered; else touch {marker}; exit 7; fi",
         "failurePolicy": {"onNonZeroExit": "fail"}},
    ]
    cp.apply(manifest("flaky", snapshotEveryNCalls=0, toolCalls=flaky,
                      retry={"maxAttempts": 2, "initialIntervalSeconds": 0}), "-n", namespace)
    cp.apply(manifest("short-lived", ttlSecondsAfterFinished=0), "-n", namespace)

    wait_until(lambda: status(cp, namespace, "slow").get("phase") == "Cancelled", 120, "the timeout to cancel the run")
    failed = condition(cp, namespace, "slow", "Failed")
    assert failed is not None and "spec.timeoutSeconds" in failed["message"]

    wait_condition(cp, namespace, "flaky", "Succeeded")
    st = status(cp, namespace, "flaky")
    assert st["attempt"] == 2
    assert st["result"]["toolResults"][-1]["stdout"] == "recovered\n"
    assert st["result"]["toolResults"][0]["stdout"] == "before\n"

    wait_gone(cp, namespace, "short-lived", timeout=120)
    wait_until(lambda: local_sandboxes(op.home) == [], 60, "every sandbox and snapshot to be gone")
