"""Acceptance 3 and 7: operator crashes (SIGKILL at fault points), a rolling update's SIGTERM handing runs to
another replica at a call boundary, and two replicas sharing a batch with every run executed exactly once.

Side effects are appended to a log outside the sandboxes, one line per execution of a call: a call whose
completion was committed must never appear twice. Kills happen at named fault points (engine/faults.py),
never at a time."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane
from tests.e2e.journal_support import OperatorJournal
from tests.e2e.operator_support import (
    effect_calls,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    replica_of,
    status,
    wait_condition,
    wait_in_flight,
)

__all__ = ["namespace", "operators"]  # fixtures

# CI runs these under the PostgreSQL journal too: once per journal (tests/e2e/journal_support.py).
pytestmark = pytest.mark.both_journals


def lease_holder(journal: OperatorJournal, ns: str) -> str | None:
    """The replica (its --worker-id) holding the one run claim of ``ns``."""
    holders = journal.run_holders(ns)
    return replica_of(holders[0]) if holders else None


def test_sigkill_at_fault_points_then_restart_completes_without_repeating_committed_calls(
    control_plane: ControlPlane, namespace: str, operators: Any, operator_journal: OperatorJournal, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    control_plane.apply(manifest("crashy", toolCalls=effect_calls(effects, 6), snapshotEveryNCalls=2), "-n", namespace)
    # Each replica dies at a different point: after a call's completion is committed, after a call's start is
    # committed but before the provider runs it, and between taking a snapshot and recording it.
    for i, fault in enumerate(("after:sandbox/c2", "before:sandbox/c4", "snapshot-taken:sandbox/snapshot/4"), 1):
        op = operators("--allow-local-provider", fault=fault, name=f"crash-{i}")
        assert op.wait_exit(timeout=180) == -signal.SIGKILL, op.logs()[-3000:]
    operators("--allow-local-provider", name="survivor")
    wait_condition(control_plane, namespace, "crashy", "Succeeded", timeout=180)

    assert effects.read_text().split() == [f"c{i}" for i in range(1, 7)]  # each call exactly once
    st = status(control_plane, namespace, "crashy")
    assert [r["stdout"] for r in st["result"]["toolResults"]] == [f"c{i}\n" for i in range(1, 7)]
    operator_journal.check(namespace, st["runId"])
    assert local_sandboxes(tmp_path / "home") == []  # nothing leaked by any of the crashes


def test_sigterm_hands_runs_over_at_a_call_boundary_to_the_other_replica(
    control_plane: ControlPlane, namespace: str, operators: Any, operator_journal: OperatorJournal, tmp_path: Path
) -> None:
    # Leases last 10 minutes here: the run can only move to the other replica because it was released.
    replicas = {name: operators("--allow-local-provider", "--lease-seconds", "600", name=name) for name in ("r-a", "r-b")}
    effects, gate = tmp_path / "effects.log", tmp_path / "gate"
    control_plane.apply(manifest("rolling", toolCalls=effect_calls(effects, 5, gate=gate, gate_at=3),
                                 snapshotEveryNCalls=0), "-n", namespace)
    wait_in_flight(control_plane, namespace, "rolling", 2)
    holder = lease_holder(operator_journal, namespace)
    assert holder in replicas
    replicas[holder].process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    gate.touch()  # the call in flight completes on the stopping replica, then the run stops at the boundary
    assert replicas[holder].wait_exit(timeout=90) == 0, replicas[holder].logs()[-3000:]
    wait_condition(control_plane, namespace, "rolling", "Succeeded", timeout=90)
    other = next(n for n in replicas if n != holder)
    assert lease_holder(operator_journal, namespace) in (other, None, "")

    assert effects.read_text().split() == [f"c{i}" for i in range(1, 6)]
    st = status(control_plane, namespace, "rolling")
    rows = operator_journal.load(namespace, st["runId"])
    provisions = [r for r in rows if r.kind == "sandbox.provision" and r.status == "completed"]
    destroys = [r for r in rows if r.kind == "sandbox.destroy" and r.status == "completed"]
    assert len(provisions) == 1  # the other replica re-attached to the same live sandbox
    assert all((r.meta or {}).get("reason") not in ("hibernate", "lost") for r in destroys)  # not finalized, not hibernated
    assert local_sandboxes(tmp_path / "home") == []


def test_two_replicas_execute_every_run_of_a_batch_exactly_once_and_take_over_from_a_dead_one(
    control_plane: ControlPlane, namespace: str, operators: Any, operator_journal: OperatorJournal, tmp_path: Path
) -> None:
    a = operators("--allow-local-provider", name="r-a")
    b = operators("--allow-local-provider", name="r-b")
    logs = tmp_path / "effects"
    logs.mkdir()
    for i in range(20):
        control_plane.apply(manifest(f"batch-{i}", toolCalls=effect_calls(logs / f"{i}.log", 3), snapshotEveryNCalls=0),
                            "-n", namespace)
    gate = tmp_path / "never"
    control_plane.apply(manifest("orphan", toolCalls=effect_calls(logs / "orphan.log", 3, gate=gate, gate_at=2),
                                 snapshotEveryNCalls=0), "-n", namespace)
    for i in range(20):
        wait_condition(control_plane, namespace, f"batch-{i}", "Succeeded", timeout=240)
    for i in range(20):
        assert (logs / f"{i}.log").read_text().split() == ["c1", "c2", "c3"], f"batch-{i}"
        operator_journal.check(namespace, status(control_plane, namespace, f"batch-{i}")["runId"])

    # Kill the replica executing the gated run; the other takes it over after the lease expires.
    wait_in_flight(control_plane, namespace, "orphan", 1)
    holder = lease_holder(operator_journal, namespace)
    dead, alive = (a, b) if holder == "r-a" else (b, a)
    dead.kill()
    gate.touch()
    wait_condition(control_plane, namespace, "orphan", "Succeeded", timeout=120)
    assert alive.alive()
    lines = (logs / "orphan.log").read_text().split()
    assert lines[0] == "c1" and lines[-2:] == ["c2", "c3"] and lines.count("c1") == 1
    assert local_sandboxes(tmp_path / "home") == []
