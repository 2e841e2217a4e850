"""The orphan sweep's decision (kube/orphans.py), and one sweep against the real local provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sandbox.kube.metrics import OperatorMetrics
from durable_sandbox.kube.orphans import RUN_ID_LABEL, LiveRun, Orphan, plan_sweep, sweep_once
from durable_sandbox.providers.contract import (
    ProviderError,
    SandboxHandle,
    SandboxSpec,
    ToolCall,
)
from durable_sandbox.providers.local import LocalProvider

OURS = "installation-a"
GRACE = 60.0
T0 = 1_000.0


def _handle(sandbox_id: str, *, owner: str | None = OURS, run_id: str | None = None) -> SandboxHandle:
    labels = {RUN_ID_LABEL: run_id} if run_id is not None else {}
    return SandboxHandle(id=sandbox_id, provider="test", metadata={"owner": owner, "labels": labels})


def _spec(run_id: str | None, owner: str | None = OURS) -> SandboxSpec:
    return SandboxSpec(owner=owner, labels={RUN_ID_LABEL: run_id} if run_id else {})


def test_orphans_wait_out_the_grace_period_then_are_destroyed() -> None:
    handles = [_handle("gone", run_id="deleted-run"), _handle("live", run_id="live-run")]
    live = {"live-run": LiveRun("live-run")}
    first = plan_sweep(handles, owner=OURS, live=live, first_seen={}, now=T0, grace=GRACE)
    assert first.destroy == () and first.waiting == {"gone": T0} and first.kept == 1
    early = plan_sweep(handles, owner=OURS, live=live, first_seen=first.waiting, now=T0 + GRACE - 1, grace=GRACE)
    assert early.destroy == () and early.waiting == {"gone": T0}
    due = plan_sweep(handles, owner=OURS, live=live, first_seen=early.waiting, now=T0 + GRACE, grace=GRACE)
    assert [(o.handle.id, o.orphaned_since) for o in due.destroy] == [("gone", T0)]
    assert "no live Workflow or Sandbox resource has run deleted-run" in due.destroy[0].reason
    assert due.waiting == {}


def test_a_sandbox_claimed_again_restarts_its_grace_period() -> None:
    handles = [_handle("late", run_id="new-run")]
    seen = plan_sweep(handles, owner=OURS, live={}, first_seen={}, now=T0, grace=GRACE).waiting
    claimed = plan_sweep(handles, owner=OURS, live={"new-run": LiveRun("new-run")}, first_seen=seen,
                         now=T0 + 10, grace=GRACE)
    assert claimed.kept == 1 and claimed.waiting == {}
    again = plan_sweep(handles, owner=OURS, live={}, first_seen=claimed.waiting, now=T0 + GRACE + 10, grace=GRACE)
    assert again.destroy == () and again.waiting == {"late": T0 + GRACE + 10}


def test_a_live_run_that_no_longer_references_a_sandbox_loses_it() -> None:
    handles = [_handle("old", run_id="run"), _handle("current", run_id="run")]
    live = {"run": LiveRun("run", sandbox_ids=frozenset({"current"}))}
    plan = plan_sweep(handles, owner=OURS, live=live, first_seen={}, now=T0, grace=0)
    assert [o.handle.id for o in plan.destroy] == ["old"] and plan.kept == 1
    assert "run run no longer references it" in plan.destroy[0].reason
    unknown = {"run": LiveRun("run")}  # references unknown: every sandbox of the run is kept
    assert plan_sweep(handles, owner=OURS, live=unknown, first_seen={}, now=T0, grace=0).destroy == ()


def test_nothing_without_our_owner_tag_is_ever_chosen() -> None:
    # A provider whose owner filter is broken lists foreign and untagged sandboxes: they stay.
    handles = [_handle("theirs", owner="installation-b", run_id="x"), _handle("untagged", owner=None),
               _handle("ours", run_id="x")]
    plan = plan_sweep(handles, owner=OURS, live={}, first_seen={}, now=T0, grace=0)
    assert [o.handle.id for o in plan.destroy] == ["ours"]
    assert plan.foreign == ("theirs", "untagged")


def test_our_sandbox_without_a_run_label_is_an_orphan() -> None:
    plan = plan_sweep([_handle("bare")], owner=OURS, live={}, first_seen={}, now=T0, grace=0)
    assert [o.handle.id for o in plan.destroy] == ["bare"] and RUN_ID_LABEL in plan.destroy[0].reason


def test_a_negative_grace_period_is_refused() -> None:
    with pytest.raises(ValueError, match="grace period must be >= 0"):
        plan_sweep([], owner=OURS, live={}, first_seen={}, now=T0, grace=-1)


async def test_sweep_of_the_local_provider_destroys_only_tagged_orphans(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path)
    orphan = await provider.provision(_spec("deleted-run"), lease_seconds=600)
    replaced = await provider.provision(_spec("live-run"), lease_seconds=600)
    current = await provider.provision(_spec("live-run"), lease_seconds=600)
    other_run = await provider.provision(_spec("other-live"), lease_seconds=600)
    theirs = await provider.provision(_spec("deleted-run", owner="installation-b"), lease_seconds=600)
    untagged = await provider.provision(_spec(None, owner=None), lease_seconds=600)
    live = {"live-run": LiveRun("live-run", frozenset({current.id})), "other-live": LiveRun("other-live")}
    reported: list[Orphan] = []
    metrics = OperatorMetrics(process_collectors=False)

    def on_destroyed(orphan: Orphan) -> None:  # what the operator's sweep timer does: a metric (and an Event)
        reported.append(orphan)
        metrics.orphans_destroyed.labels(provider=orphan.handle.provider).inc()

    first = await sweep_once(provider, owner=OURS, live=live, first_seen={}, now=T0, grace=GRACE,
                             on_destroyed=on_destroyed)
    assert first.destroyed == () and set(first.plan.waiting) == {orphan.id, replaced.id}
    second = await sweep_once(provider, owner=OURS, live=live, first_seen=first.plan.waiting, now=T0 + GRACE,
                              grace=GRACE, on_destroyed=on_destroyed)
    assert {o.handle.id for o in second.destroyed} == {orphan.id, replaced.id} == {o.handle.id for o in reported}
    assert second.failed == () and second.plan.waiting == {}
    assert b'durable_sandbox_orphan_sandboxes_destroyed_total{provider="local"} 2.0' in metrics.generate()

    assert {h.id for h in await provider.list_sandboxes(OURS)} == {current.id, other_run.id}
    for gone in (orphan, replaced):
        assert not provider.workspace_path(gone.id).exists()
    for kept in (current, other_run, theirs, untagged):  # still usable, not just listed
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
    orphan = await provider.provision(_spec("deleted-run"), lease_seconds=600)
    refused = await sweep_once(provider, owner=OURS, live={}, first_seen={orphan.id: T0}, now=T0 + GRACE,
                               grace=GRACE)
    assert refused.destroyed == () and [(o.handle.id, e) for o, e in refused.failed] == [
        (orphan.id, f"destroy of {orphan.id} refused (injected)")]
    assert refused.plan.waiting == {orphan.id: T0}, "kept with its first sighting, so it is due at once"
    provider.refuse = False
    retried = await sweep_once(provider, owner=OURS, live={}, first_seen=refused.plan.waiting, now=T0 + GRACE + 1,
                               grace=GRACE)
    assert [o.handle.id for o in retried.destroyed] == [orphan.id]
    assert await provider.list_sandboxes(OURS) == []
