"""Acceptance 2 and 4 (first part): snapshot cadence and sandbox-loss recovery in the cluster, and deleting a
Workflow mid-run (its sandbox and every snapshot are gone before the object is)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.journal_support import OperatorJournal
from tests.e2e.operator_support import (
    event_reasons,
    get,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_gone,
    wait_in_flight,
)

__all__ = ["namespace", "operators"]  # fixtures

# CI runs these under the PostgreSQL journal too: once per journal (tests/e2e/journal_support.py).
pytestmark = pytest.mark.both_journals

CALLS = [{"type": "shell", "command": f"echo {i} >> log.txt; cat log.txt | wc -l"} for i in range(1, 7)]


def test_loss_is_recovered_from_the_newest_snapshot_and_superseded_snapshots_are_deleted(
    control_plane: ControlPlane, namespace: str, operators: Any, operator_journal: OperatorJournal
) -> None:
    op = operators("--allow-local-provider")
    control_plane.apply(manifest("lossy", toolCalls=CALLS, snapshotEveryNCalls=2, injectLossAfterNCalls=3), "-n", namespace)
    wait_condition(control_plane, namespace, "lossy", "Succeeded", timeout=120)
    st = status(control_plane, namespace, "lossy")
    assert st["recoveryCount"] == 1
    # Every call saw the workspace as if nothing was lost: line counts 1..6.
    assert [r["stdout"] for r in st["result"]["toolResults"]] == [f"{i}\n" for i in range(1, 7)]
    reasons = event_reasons(control_plane, namespace, "lossy")
    assert "SandboxLost" in reasons and "Recovered" in reasons

    rows = operator_journal.load(namespace, st["runId"])
    done = [(r.op_id.split("/", 1)[1], r.kind) for r in rows if r.status == "completed"]
    kinds = [k for _, k in done]
    assert "sandbox.inject_loss" in kinds
    restore = next(r for r in rows if r.kind == "sandbox.restore" and r.status == "completed")
    assert restore.meta is not None and restore.meta["reason"] == "recovery"
    assert restore.meta["snapshotId"] and len(restore.meta["replayed"]) == 1  # the call after snapshot 2
    # The snapshot at 2 is deleted only after the one at 4 is recorded; the one at 6 is deleted at the end.
    order = [op_id for op_id, _ in done]
    assert order.index("snapshot/2/delete") > order.index("snapshot/4")
    assert order.index("snapshot/4/delete") > order.index("snapshot/6")
    seqs = [r.seq for r in rows]
    assert seqs == list(range(1, len(rows) + 1))  # no gaps, no duplicates
    assert local_sandboxes(op.home) == []


def test_delete_mid_run_removes_sandbox_and_snapshots_before_the_object_goes(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    op = operators("--allow-local-provider")
    gate = tmp_path / "never"
    calls = [*CALLS[:3], {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}]
    control_plane.apply(manifest("doomed", toolCalls=calls, snapshotEveryNCalls=2), "-n", namespace)
    wait_in_flight(control_plane, namespace, "doomed", 3)
    assert any(s.startswith("local/snapshots/") for s in local_sandboxes(op.home))
    obj = get(control_plane, namespace, "doomed")
    assert obj is not None and "durable-sandbox.dev/cleanup" in obj["metadata"]["finalizers"]

    # Watch the object while deleting: it must never disappear while the provider still has anything.
    seen: list[tuple[bool, list[str]]] = []
    control_plane.kubectl("delete", "workflow", "doomed", "-n", namespace, "--wait=false")

    def gone() -> bool:
        exists = get(control_plane, namespace, "doomed") is not None
        seen.append((exists, local_sandboxes(op.home)))
        return not exists

    wait_until(gone, 120, "the Workflow to be deleted")
    assert local_sandboxes(op.home) == []
    # While the object still existed, cleanup was in progress; once it was gone nothing was left.
    assert all(inventory == [] for exists, inventory in seen if not exists), json.dumps(seen)
    wait_gone(control_plane, namespace, "doomed")
