"""Acceptance 1: `kubectl apply` the example Workflow, `kubectl wait` for Succeeded, `kubectl get dwf` and
`kubectl describe` show what users need, and the tool results are those of `dsb run` on the same file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.dsb import dsb
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import (
    HELLO,
    event_reasons,
    local_sandboxes,
    namespace,
    operators,
    status,
    wait_condition,
)

__all__ = ["namespace", "operators"]  # fixtures

# CI runs these under the PostgreSQL journal too: once per journal (tests/e2e/journal_support.py).
pytestmark = pytest.mark.both_journals


def _outcomes(result: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(r["exitCode"], r["stdout"], r["stderr"]) for r in result["toolResults"]]


def test_hello_workflow_in_the_cluster_matches_dsb_run(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    op = operators("--allow-local-provider")
    control_plane.kubectl("apply", "-n", namespace, "-f", str(HELLO))
    wait_condition(control_plane, namespace, "hello", "Succeeded", timeout=120)

    st = status(control_plane, namespace, "hello")
    assert st["phase"] == "Succeeded"
    assert st["calls"] == {"completed": 4, "total": 4}
    assert st["runId"].startswith("hello-")
    assert st["startedAt"].endswith("Z") and st["finishedAt"].endswith("Z")
    assert "kopf.zalando.org" not in json.dumps(control_plane.kubectl_json("get", "workflow", "hello", "-n", namespace)["metadata"])

    table = control_plane.kubectl("get", "dwf", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "CALLS", "SNAPSHOT", "AGE"]
    assert table[1].split()[:3] == ["hello", "Succeeded", "4"]

    described = control_plane.kubectl("describe", "workflow", "hello", "-n", namespace).stdout
    assert "Conditions:" in described and "Succeeded" in described
    reasons = event_reasons(control_plane, namespace, "hello")
    assert "Provisioned" in reasons and "SnapshotTaken" in reasons and "Succeeded" in reasons
    assert "Events:" in described and "Provisioned" in described
    # Lifecycle events only: four calls, not one event per call.
    assert len(reasons) < 10, reasons

    local = dsb("run", str(HELLO), "-o", "json", "--store", str(tmp_path / "local.db"),
                env={"DURABLE_SANDBOX_HOME": str(tmp_path / "local-home")}, process=True)
    assert local.returncode == 0, local.stderr
    assert _outcomes(st["result"]) == _outcomes(json.loads(local.stdout)["result"])
    # Finished runs keep no sandbox and no snapshot.
    assert local_sandboxes(op.home) == []

    # Deleted as users do: kubectl waits for the finalizer, which a finished Workflow's cleanup lets go at once
    # (issue 12: it used to wait for the end of the daemon's 60 s graceful backoff).
    control_plane.kubectl("delete", "-n", namespace, "-f", str(HELLO), "--timeout=60s")
    assert "CleanupDone" in event_reasons(control_plane, namespace, "hello")
    # The whole run, its deletion and the operator's SIGTERM: no traceback, no ERROR (issue 24).
    op.check_log()
