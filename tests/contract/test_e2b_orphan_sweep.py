"""The orphan sweep against the e2b provider and the fake E2B's inventory: running and paused, every page."""

from __future__ import annotations

from durable_sandbox.kube.orphans import RUN_ID_LABEL, LiveRun, sweep_once
from durable_sandbox.providers.contract import SandboxSpec
from durable_sandbox.providers.e2b import E2BProvider
from tests.fakes.e2b_state import FakeState

OURS = "installation-a"


def _spec(run_id: str | None, owner: str | None = OURS) -> SandboxSpec:
    return SandboxSpec(owner=owner, labels={RUN_ID_LABEL: run_id} if run_id else {})


async def test_sweep_destroys_tagged_orphans_running_or_paused_and_nothing_else(
    e2b: E2BProvider, fake_e2b: FakeState
) -> None:
    orphan = await e2b.provision(_spec("deleted-run"), lease_seconds=300)
    paused_orphan = await e2b.provision(_spec("deleted-run"), lease_seconds=300)
    live = await e2b.provision(_spec("live-run"), lease_seconds=300)
    theirs = await e2b.provision(_spec("deleted-run", owner="installation-b"), lease_seconds=300)
    untagged = await e2b.provision(_spec(None, owner=None), lease_seconds=300)
    fake_e2b.sandboxes[paused_orphan.id].state = "paused"  # a paused sandbox outlives its timeout: must go
    fake_e2b.page_size, fake_e2b.filter_after_paging = 1, True

    result = await sweep_once(e2b, owner=OURS, live={"live-run": LiveRun("live-run")}, first_seen={},
                              now=0.0, grace=0.0)
    assert {o.handle.id for o in result.destroyed} == {orphan.id, paused_orphan.id} and result.failed == ()
    assert sorted(fake_e2b.live_sandboxes()) == sorted([live.id, theirs.id, untagged.id])
    deletes = [r.path for r in fake_e2b.requests if r.method == "DELETE"]
    assert sorted(deletes) == sorted(f"/sandboxes/{h.id}" for h in (orphan, paused_orphan))
