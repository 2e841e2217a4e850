"""Issue 32, item 4, where people look: a Workflow whose sandbox code makes a workspace over the snapshot limit
(a sparse file) fails with the Failed condition and a Warning Event naming the limit; the operator goes on."""

from __future__ import annotations

from typing import Any

from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import condition, events, manifest, namespace, operators, wait_condition

__all__ = ["namespace", "operators"]  # fixtures


def test_a_snapshot_over_the_limit_fails_the_run_with_a_warning_naming_it(
        control_plane: ControlPlane, namespace: str, operators: Any) -> None:
    operators("--allow-local-provider")
    calls = [{"type": "shell", "command": "truncate -s 2G holes"}, {"type": "shell", "command": "echo next"}]
    control_plane.apply(manifest("sparse", toolCalls=calls, snapshotEveryNCalls=1), "-n", namespace)
    wait_condition(control_plane, namespace, "sparse", "Failed", timeout=120)
    failed = condition(control_plane, namespace, "sparse", "Failed")
    assert failed is not None and "larger than the limit of 1 GiB" in failed["message"], failed
    warnings = [e for e in events(control_plane, namespace, "sparse")
                if e["type"] == "Warning" and e["reason"] == "Failed"]
    assert warnings and "ArchiveTooLarge" in warnings[0]["message"] and "1 GiB" in warnings[0]["message"], warnings
    # The operator goes on: the next Workflow runs.
    control_plane.apply(manifest("after", snapshotEveryNCalls=1), "-n", namespace)
    wait_condition(control_plane, namespace, "after", "Succeeded", timeout=120)
