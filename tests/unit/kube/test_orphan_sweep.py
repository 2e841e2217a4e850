"""The orphan sweep's decision (kube/sweep/orphans.py), the live owners the operator derives from its resources
(kube/sweep/sweeper.py), and sweeps against the real local provider (sandboxes and snapshots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine.records import RunStatus
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.store import run_key
from durable_sandbox.kube.store.finished import read_finished
from durable_sandbox.kube.sweep.orphans import Inventory, LiveOwner, Orphan, SweepPlan, plan_sweep, sweep_once
from durable_sandbox.kube.sweep.sweeper import default_installation_id, live_owners
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    ProviderError,
    SandboxHandle,
    SandboxSpec,
    SnapshotEntry,
    ToolCall,
    tag_key,
)
from durable_sandbox.providers.local import LocalProvider
from tests.unit.kube.journal_heads_support import Journal

OURS = "ns-a/durable-sandbox"
GRACE = 60.0
T0 = 1_000.0


def _handle(sandbox_id: str, owner: str | None, *, installation: str | None = OURS) -> SandboxHandle:
    labels = {INSTALLATION_LABEL: installation} if installation is not None else {}
    return SandboxHandle(id=sandbox_id, provider="test", metadata={"owner": owner, "labels": labels})


def _snapshot(snapshot_id: str, owner: str | None, *, installation: str = OURS, retained: bool = False) -> SnapshotEntry:
    return SnapshotEntry(id=snapshot_id, provider="test", installation_key=tag_key(installation),
                         owner_key=tag_key(owner) if owner else None, retained=retained)


def _plan(sandboxes: list[SandboxHandle], snapshots: list[SnapshotEntry] | None = None, **kw: Any) -> SweepPlan:
    options: dict[str, Any] = {"installation": OURS, "live": {}, "first_seen": {}, "now": T0, "grace": 0.0}
    options.update(kw)
    return plan_sweep(Inventory(tuple(sandboxes), tuple(snapshots or [])), **options)


def test_orphans_wait_out_the_grace_period_then_are_destroyed() -> None:
    inventory = Inventory((_handle("gone", "ns/deleted"), _handle("live", "ns/live")), (_snapshot("snap", "ns/deleted"),))
    live = {"ns/live": LiveOwner("ns/live")}
    first = plan_sweep(inventory, installation=OURS, live=live, first_seen={}, now=T0, grace=GRACE)
    assert first.destroy == () and first.waiting == {"sandbox:gone": T0, "snapshot:snap": T0} and first.kept == 1
    early = plan_sweep(inventory, installation=OURS, live=live, first_seen=first.waiting, now=T0 + GRACE - 1, grace=GRACE)
    assert early.destroy == () and early.waiting == first.waiting
    due = plan_sweep(inventory, installation=OURS, live=live, first_seen=early.waiting, now=T0 + GRACE, grace=GRACE)
    assert [(o.kind, o.id, o.orphaned_since) for o in due.destroy] == [("sandbox", "gone", T0), ("snapshot", "snap", T0)]
    assert "its owner ns/deleted is no live Workflow or Sandbox resource" in due.destroy[0].reason
    assert due.waiting == {}


def test_an_item_claimed_again_restarts_its_grace_period() -> None:
    inventory = Inventory((_handle("late", "ns/new"),), ())
    seen = plan_sweep(inventory, installation=OURS, live={}, first_seen={}, now=T0, grace=GRACE).waiting
    claimed = plan_sweep(inventory, installation=OURS, live={"ns/new": LiveOwner("ns/new")}, first_seen=seen,
                         now=T0 + 10, grace=GRACE)
    assert claimed.kept == 1 and claimed.waiting == {}
    again = plan_sweep(inventory, installation=OURS, live={}, first_seen=claimed.waiting, now=T0 + GRACE + 10, grace=GRACE)
    assert again.destroy == () and again.waiting == {"sandbox:late": T0 + GRACE + 10}


def test_a_live_owner_that_no_longer_references_an_item_loses_it() -> None:
    live = {"ns/sb": LiveOwner("ns/sb", sandbox_ids=frozenset({"current"}), snapshot_ids=frozenset({"s2"}))}
    plan = _plan([_handle("old", "ns/sb"), _handle("current", "ns/sb")], [_snapshot("s1", "ns/sb"), _snapshot("s2", "ns/sb")],
                 live=live)
    assert [(o.kind, o.id) for o in plan.destroy] == [("sandbox", "old"), ("snapshot", "s1")]
    assert all("its owner ns/sb no longer references it" in o.reason for o in plan.destroy)
    unknown = {"ns/sb": LiveOwner("ns/sb")}  # references unknown (a run in progress): everything is kept
    assert _plan([_handle("old", "ns/sb")], [_snapshot("s1", "ns/sb")], live=unknown).destroy == ()


def test_nothing_without_our_installation_label_is_ever_chosen() -> None:
    # A provider whose filter is broken lists foreign and unlabelled items: they stay.
    plan = _plan([_handle("theirs", "ns/x", installation="ns-b/durable-sandbox"), _handle("unlabelled", "ns/x", installation=None),
                  _handle("ours", "ns/x")],
                 [_snapshot("their-snap", "ns/x", installation="ns-b/durable-sandbox"), _snapshot("our-snap", "ns/x")])
    assert [o.id for o in plan.destroy] == ["ours", "our-snap"]
    assert plan.foreign == ("theirs", "unlabelled", "their-snap")


def test_retained_and_referenced_snapshots_are_never_removed_and_ownerless_items_are_orphans() -> None:
    plan = _plan([_handle("bare", None)],
                 [_snapshot("kept", "ns/deleted", retained=True), _snapshot("source", "ns/deleted"), _snapshot("loose", None)],
                 protected=frozenset({"source"}))
    assert [o.id for o in plan.destroy] == ["bare", "loose"] and plan.kept == 2
    assert all("no owner tag" in o.reason for o in plan.destroy)


def test_a_negative_grace_period_is_refused() -> None:
    with pytest.raises(ValueError, match="grace period must be >= 0"):
        _plan([], grace=-1.0)


def _wf(uid: str, phase: str | None, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"namespace": "ns", "name": f"wf-{uid}", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase} if phase else {}}


def test_live_owners_from_what_the_operator_records_never_from_status() -> None:
    # Every status below says the opposite of the operator's records: status is anyone's with */status rights.
    workflows = [_wf("running", "Succeeded"), _wf("new", "Succeeded"), _wf("done", "Running"),
                 _wf("going", "Failed", True)]
    finished = frozenset({f"ns/{run_key(cluster_run_id('wf-done', 'done'))}",
                          f"ns/{run_key(cluster_run_id('wf-going', 'going'))}"})
    sandboxes = [
        {"metadata": {"namespace": "ns", "name": "a", "uid": "sb-a"}, "spec": {"fromSnapshot": "user-snap"},
         "status": {"providerId": "forged", "snapshots": []}},
        {"metadata": {"namespace": "ns", "name": "b", "uid": "sb-b"}, "status": {}},
        {"metadata": {"namespace": "ns", "name": "c", "uid": "sb-c"}, "status": {"providerId": "p3"}},
        {"metadata": {"namespace": "ns", "name": "d", "uid": "sb-d"}, "status": {"providerId": "p4"}},
    ]
    records = {"sb-a": {"providerId": "p1", "snapshots": ["s1", "s2"]},
               "sb-b": {"operation": {"id": "op", "kind": "snapshot"}}, "sb-c": None}
    live, protected, bodies = live_owners(workflows, sandboxes, finished_runs=finished, records=records)
    assert live["ns/running"] == LiveOwner("ns/running"), "its journal says it has not finished"
    assert live["ns/new"] == LiveOwner("ns/new"), "no journal yet: not started"
    assert live["ns/done"] == LiveOwner("ns/done", frozenset(), frozenset()), "a finished run references nothing"
    assert live["ns/going"] == LiveOwner("ns/going"), "being deleted: its finalizer cleans up, the sweep waits"
    assert live["ns/sb-a"] == LiveOwner("ns/sb-a", frozenset({"p1"}), frozenset({"s1", "s2"}))
    assert live["ns/sb-b"] == LiveOwner("ns/sb-b"), "an operation in flight: unknown"
    assert live["ns/sb-c"] == LiveOwner("ns/sb-c"), "a record that fails its seals: unknown, everything kept"
    assert live["ns/sb-d"] == LiveOwner("ns/sb-d"), "no record yet: unknown"
    assert protected == {"user-snap"} and set(bodies) == set(live)


async def test_a_workflow_whose_run_continued_as_new_is_finished_only_at_the_end_of_its_chain() -> None:
    """The chain's live sandbox belongs to a Workflow whose first run ended (continued as new): never swept. Read
    from the runs' sealed heads as the operator wrote them (tests/unit/kube/test_sweep_sealed_runs.py: forgeries)."""
    going, done = cluster_run_id("wf-going", "going"), cluster_run_id("wf-done", "done")
    journal = Journal()
    await journal.chain(going, RunStatus.SUCCEEDED, RunStatus.SUCCEEDED, RunStatus.RUNNING)
    await journal.chain(done, RunStatus.SUCCEEDED, RunStatus.FAILED)
    await journal.run("old", RunStatus.CANCELLED)
    keys = (await read_finished(journal.heads)).keys
    assert run_key(going) not in keys and run_key(f"{going}~1") not in keys  # they continued: the chain goes on
    assert keys == {run_key(done), run_key(f"{done}~1"), "old"}  # a chain's end marks its Workflow's run finished
    workflows = [_wf("going", "Succeeded"), _wf("done", "Running")]
    live, _, _ = live_owners(workflows, [], finished_runs=frozenset(f"ns/{k}" for k in keys), records={})
    assert live["ns/going"] == LiveOwner("ns/going"), "its chain runs on: everything it holds is kept"
    assert live["ns/done"] == LiveOwner("ns/done", frozenset(), frozenset())


def test_a_sandboxs_session_snapshots_are_referenced_by_it() -> None:
    """The snapshots a Sandbox's session calls took (spec.snapshotEveryNCalls) are in their journal, not in its
    record: a live Sandbox references them too, so the sweep never takes the one a loss would restore."""
    sandboxes = [{"metadata": {"namespace": "ns", "name": "a", "uid": "sb-a"}}]
    live, _, _ = live_owners([], sandboxes, finished_runs=frozenset(), records={"sb-a": {"snapshots": ["s1"]}},
                             session_snapshots={"sb-a": frozenset({"calls-6"})})
    assert live["ns/sb-a"] == LiveOwner("ns/sb-a", frozenset(), frozenset({"s1", "calls-6"}))


def test_a_forks_copy_of_its_sources_snapshot_is_never_an_orphan() -> None:
    """A Sandbox fork's copy of its source's snapshot (sessions/fork_restore.py) keeps the source's owner tag; the
    fork's journal holds it, so neither the source no longer referencing it nor the source's deletion frees it."""
    sandboxes = [{"metadata": {"namespace": "ns", "name": "fork", "uid": "sb-fork"}}]
    live, protected, _ = live_owners([], sandboxes, finished_runs=frozenset(), records={"sb-fork": {}},
                                     session_snapshots={"sb-fork": frozenset({"copy-4"})})
    assert "copy-4" in protected
    for owners in ({}, {"ns/sb-src": LiveOwner("ns/sb-src", frozenset(), frozenset({"src-4"}))}):
        plan = _plan([], [_snapshot("copy-4", "ns/sb-src")], live={**live, **owners}, protected=protected)
        assert plan.destroy == () and plan.kept == 1


def _spec(owner: str | None, installation: str | None = OURS, **labels: str) -> SandboxSpec:
    return SandboxSpec(owner=owner, labels={**({INSTALLATION_LABEL: installation} if installation else {}), **labels})


async def test_sweep_of_the_local_provider_removes_only_our_orphans(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path)
    orphan = await provider.provision(_spec("ns/deleted"), lease_seconds=600)
    orphan_snap = await provider.snapshot(orphan, operation_id="orphan-snap")
    retained = await provider.provision(_spec("ns/deleted", **{RETAIN_LABEL: "true"}), lease_seconds=600)
    retained_snap = await provider.snapshot(retained, operation_id="retained-snap")
    await provider.destroy(retained)
    replaced = await provider.provision(_spec("ns/sb"), lease_seconds=600)
    current = await provider.provision(_spec("ns/sb"), lease_seconds=600)
    current_snap = await provider.snapshot(current, operation_id="current-snap")
    running = await provider.provision(_spec("ns/running"), lease_seconds=600)
    theirs = await provider.provision(_spec("ns/deleted", installation="ns-b/durable-sandbox"), lease_seconds=600)
    their_snap = await provider.snapshot(theirs, operation_id="their-snap")
    untagged = await provider.provision(_spec(None, installation=None), lease_seconds=600)
    untagged_snap = await provider.snapshot(untagged, operation_id="untagged-snap")
    live = {"ns/sb": LiveOwner("ns/sb", frozenset({current.id}), frozenset({current_snap})),
            "ns/running": LiveOwner("ns/running")}
    reported: list[Orphan] = []
    metrics = OperatorMetrics(process_collectors=False)

    def on_destroyed(orphan: Orphan) -> None:  # what the operator's sweep timer does: a metric (and an Event)
        reported.append(orphan)
        counter = metrics.orphans_destroyed if orphan.kind == "sandbox" else metrics.orphan_snapshots_destroyed
        counter.labels(provider="local").inc()

    first = await sweep_once(provider, installation=OURS, live=live, first_seen={}, now=T0, grace=GRACE,
                             on_destroyed=on_destroyed)
    assert first.destroyed == ()
    assert set(first.plan.waiting) == {f"sandbox:{orphan.id}", f"sandbox:{replaced.id}", f"snapshot:{orphan_snap}"}
    second = await sweep_once(provider, installation=OURS, live=live, first_seen=first.plan.waiting, now=T0 + GRACE,
                              grace=GRACE, on_destroyed=on_destroyed)
    assert {o.id for o in second.destroyed} == {orphan.id, replaced.id, orphan_snap} == {o.id for o in reported}
    assert second.failed == () and second.plan.waiting == {}
    exposition = metrics.generate()
    assert b'durable_sandbox_orphan_sandboxes_destroyed_total{provider="local"} 2.0' in exposition
    assert b'durable_sandbox_orphan_snapshots_destroyed_total{provider="local"} 1.0' in exposition

    assert {h.id for h in await provider.inventory_sandboxes(OURS)} == {current.id, running.id}
    assert sorted(provider.list_snapshots()) == sorted([retained_snap, current_snap, their_snap, untagged_snap])
    for gone in (orphan, replaced):
        assert not provider.workspace_path(gone.id).exists()
    for kept in (current, running, theirs, untagged):  # still usable, not just listed
        result = await provider.execute(kept, ToolCall(operation_id=f"probe-{kept.id}", type="shell",
                                                       args={"command": "echo alive"}))
        assert result.outcome == (0, "alive\n", "")


class _RefusingDestroy(LocalProvider):
    refuse = True

    async def destroy(self, handle: SandboxHandle) -> None:
        if self.refuse:
            raise ProviderError(f"destroy of {handle.id} refused (injected)")
        await super().destroy(handle)


async def test_a_refused_destroy_is_retried_on_the_next_sweep(tmp_path: Path) -> None:
    provider = _RefusingDestroy(tmp_path)
    orphan = await provider.provision(_spec("ns/deleted"), lease_seconds=600)
    key = f"sandbox:{orphan.id}"
    refused = await sweep_once(provider, installation=OURS, live={}, first_seen={key: T0}, now=T0 + GRACE, grace=GRACE)
    assert refused.destroyed == () and [(o.id, e) for o, e in refused.failed] == [
        (orphan.id, f"destroy of {orphan.id} refused (injected)")]
    assert refused.plan.waiting == {key: T0}, "kept with its first sighting, so it is due at once"
    provider.refuse = False
    retried = await sweep_once(provider, installation=OURS, live={}, first_seen=refused.plan.waiting, now=T0 + GRACE + 1,
                               grace=GRACE)
    assert [o.id for o in retried.destroyed] == [orphan.id]
    assert await provider.inventory_sandboxes(OURS) == []


def test_the_default_installation_id_separates_operators_serving_different_namespaces() -> None:
    assert default_installation_id(["b", "a", "b"], {}) == default_installation_id(["a", "b"], {}) == "namespaces:a,b"
    assert default_installation_id(["a"], {}) != default_installation_id(["b"], {})
    assert default_installation_id([], {"POD_NAMESPACE": "ops"}) == "ops/durable-sandbox"
    assert default_installation_id([], {}) == "durable-sandbox"
