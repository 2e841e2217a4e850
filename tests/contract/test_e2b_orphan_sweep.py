"""The orphan sweep against the e2b provider and the fake E2B's inventory: sandboxes running or paused and
snapshots (tagged by name), on every page, and nothing of another installation or untagged."""

from __future__ import annotations

from durable_sandbox.kube.sweep.orphans import LiveOwner, sweep_once
from durable_sandbox.providers.contract import INSTALLATION_LABEL, RETAIN_LABEL, SandboxSpec
from durable_sandbox.providers.e2b import E2BProvider
from tests.fakes.e2b_state import FakeState

OURS = "ns-a/durable-sandbox"


def _spec(owner: str | None, installation: str | None = OURS, **labels: str) -> SandboxSpec:
    return SandboxSpec(owner=owner, labels={**({INSTALLATION_LABEL: installation} if installation else {}), **labels})


async def test_sweep_removes_our_orphans_running_or_paused_and_their_snapshots_and_nothing_else(
    e2b: E2BProvider, fake_e2b: FakeState
) -> None:
    orphan = await e2b.provision(_spec("ns/deleted"), lease_seconds=300)
    orphan_snap = await e2b.snapshot(orphan, operation_id="orphan-snap")
    paused_orphan = await e2b.provision(_spec("ns/deleted"), lease_seconds=300)
    live = await e2b.provision(_spec("ns/live"), lease_seconds=300)
    live_snap = await e2b.snapshot(live, operation_id="live-snap")
    kept = await e2b.provision(_spec("ns/deleted", **{RETAIN_LABEL: "true"}), lease_seconds=300)
    retained_snap = await e2b.snapshot(kept, operation_id="retained-snap")
    await e2b.destroy(kept)
    theirs = await e2b.provision(_spec("ns/deleted", installation="ns-b/durable-sandbox"), lease_seconds=300)
    their_snap = await e2b.snapshot(theirs, operation_id="their-snap")
    untagged = await e2b.provision(_spec(None, installation=None), lease_seconds=300)
    untagged_snap = await e2b.snapshot(untagged, operation_id="untagged-snap")
    fake_e2b.sandboxes[paused_orphan.id].state = "paused"  # a paused sandbox outlives its timeout: must go
    fake_e2b.page_size, fake_e2b.filter_after_paging = 1, True

    result = await sweep_once(e2b, installation=OURS, live={"ns/live": LiveOwner("ns/live")}, first_seen={},
                              now=0.0, grace=0.0)
    assert {(o.kind, o.id) for o in result.destroyed} == {
        ("sandbox", orphan.id), ("sandbox", paused_orphan.id), ("snapshot", orphan_snap)} and result.failed == ()
    assert sorted(fake_e2b.live_sandboxes()) == sorted([live.id, theirs.id, untagged.id])
    assert sorted(s.id for s in fake_e2b.snapshots()) == sorted([live_snap, retained_snap, their_snap, untagged_snap])
    deletes = [r.path for r in fake_e2b.requests if r.method == "DELETE"]
    assert f"/templates/{orphan_snap}" in [p.replace("%2F", "/").replace("%3A", ":") for p in deletes]
