"""Issue 14, acceptance 3: a create whose answer is lost yields exactly one sandbox (Idempotency-Key derived
from the operation id, honoured by the fake as E2B's v2 create documents it: "retries reuse it"); snapshot
reconciliation finds the existing snapshot by its full namespaced name on any page; listing by owner sees
running and paused sandboxes on every page."""

from __future__ import annotations

import httpx

from durable_sandbox.providers.contract import SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import OWNER_METADATA_KEY, E2BProvider, snapshot_name
from tests.contract.e2b_support import RecordingSleep, make_provider
from tests.fakes.e2b_state import TEAM_SLUG, FakeState

SPEC = SandboxSpec(owner="reconcile", labels={"run": "r1"}, operation_id="run-1/ws/provision")


async def test_a_lost_create_answer_retried_yields_exactly_one_sandbox(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    fake_e2b.drop_connection_after_create()
    handle = await e2b.provision(SPEC, lease_seconds=300)
    creates = fake_e2b.calls("POST", "/v2/sandboxes")
    assert len(creates) == 2, "the create was sent again after its answer was lost"
    assert creates[0].headers["Idempotency-Key"] == creates[1].headers["Idempotency-Key"]
    assert fake_e2b.live_sandboxes() == [handle.id], "the retry got the first sandbox back, not a second one"
    assert (await e2b.execute(handle, ToolCall(operation_id="s", type="shell", args={"command": "echo one"}))).stdout == "one\n"


async def test_a_retry_while_the_first_create_is_in_progress_waits_for_its_answer(fake_e2b: FakeState) -> None:
    sleep = RecordingSleep()
    provider = make_provider(fake_e2b, sleep=sleep)
    fake_e2b.drop_connection_after_create()
    fake_e2b.report_create_in_progress(2)
    handle = await provider.provision(SPEC, lease_seconds=300)
    await provider.aclose()
    assert [r.status for r in fake_e2b.calls("POST", "/v2/sandboxes")] == [0, 409, 409, 201]
    assert fake_e2b.live_sandboxes() == [handle.id] and len(sleep.delays) == 3


async def test_a_retried_operation_gets_its_sandbox_back(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    """The engine retries a provision whose outcome it never saw with the same operation id: same key,
    same sandbox. A different operation gets a different sandbox."""
    first = await e2b.provision(SPEC, lease_seconds=300)
    again = await e2b.provision(SPEC, lease_seconds=300)
    other = await e2b.provision(SPEC.model_copy(update={"operation_id": "run-1/ws/restore/1"}), lease_seconds=300)
    assert again.id == first.id and other.id != first.id
    assert sorted(fake_e2b.live_sandboxes()) == sorted({first.id, other.id})
    keys = [r.headers["Idempotency-Key"] for r in fake_e2b.calls("POST", "/v2/sandboxes")]
    assert keys[0] == keys[1] != keys[2]


async def test_after_destroy_the_same_operation_creates_anew(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    """A session reaps an unrecorded sandbox and provisions again under the same operation id: E2B's
    remembered answer would point at the destroyed sandbox, so the key moves on."""
    first = await e2b.provision(SPEC, lease_seconds=300)
    await e2b.destroy(first)
    second = await e2b.provision(SPEC, lease_seconds=300)
    assert second.id != first.id and fake_e2b.live_sandboxes() == [second.id]


async def test_a_new_process_does_not_reuse_the_old_processes_keys(fake_e2b: FakeState) -> None:
    """After a crash the session has reaped what the old process may have created; the new process's
    create must not be answered with that sandbox."""
    old, new = make_provider(fake_e2b), make_provider(fake_e2b)
    try:
        assert (await old.provision(SPEC, lease_seconds=60)).id != (await new.provision(SPEC, lease_seconds=60)).id
    finally:
        await old.aclose()
        await new.aclose()


async def test_the_fake_refuses_a_key_reused_for_another_request(fake_e2b: FakeState) -> None:
    async with httpx.AsyncClient(base_url=fake_e2b.api_url, headers={"X-API-Key": fake_e2b.api_key}) as client:
        first = await client.post("/v2/sandboxes", json={"templateID": "base"}, headers={"Idempotency-Key": "k-1"})
        same = await client.post("/v2/sandboxes", json={"templateID": "base"}, headers={"Idempotency-Key": "k-1"})
        other = await client.post("/v2/sandboxes", json={"templateID": "base", "timeout": 9},
                                  headers={"Idempotency-Key": "k-1"})
    assert first.status_code == same.status_code == 201 and first.json() == same.json()
    assert other.status_code == 422 and other.json()["error_code"] == "idempotency_request_mismatch"
    assert len(fake_e2b.live_sandboxes()) == 1


async def test_snapshot_reconciliation_matches_the_full_name_on_a_later_page(e2b: E2BProvider,
                                                                            fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    for name in ("someone-else-1", "someone-else-2"):
        fake_e2b.take_snapshot(fake_e2b.sandboxes[handle.id], name)
    fake_e2b.drop_connection_after_snapshot()
    # One entry per page, filtered after paging: the lookup's match sits behind empty pages.
    fake_e2b.page_size, fake_e2b.filter_after_paging = 1, True
    snapshot_id = await e2b.snapshot(handle, operation_id="snap-op")
    ours = [s for s in fake_e2b.snapshots() if s.name == snapshot_name("snap-op")]
    assert [s.id for s in ours] == [snapshot_id] and ours[0].builds == 1, "found again, not rebuilt"
    assert ours[0].names == [f"{TEAM_SLUG}/{snapshot_name('snap-op')}:default"], "E2B reports the full name"
    lookups = fake_e2b.calls("GET", "/snapshots")
    assert any("nextToken" in r.query for r in lookups), "the lookup followed X-Next-Token"
    assert len(fake_e2b.calls("POST", f"/sandboxes/{handle.id}/snapshots")) == 1


async def test_list_by_owner_sees_running_and_paused_sandboxes_on_every_page(e2b: E2BProvider,
                                                                             fake_e2b: FakeState) -> None:
    # A space, ':', '/' and a '%25' that only survives the SDK's two encoding layers (one layer would make it '%').
    owner = "team a: 100%25/sweep"
    mine = [await e2b.provision(SandboxSpec(owner=owner), lease_seconds=300) for _ in range(3)]
    theirs = await e2b.provision(SandboxSpec(owner="other"), lease_seconds=300)
    fake_e2b.sandboxes[mine[1].id].state = "paused"  # paused by someone else: still ours to sweep
    fake_e2b.page_size, fake_e2b.filter_after_paging = 1, True
    listed = await e2b.list_sandboxes(owner)
    assert [h.id for h in listed] == [h.id for h in mine] and theirs.id not in {h.id for h in listed}
    assert [h.metadata["state"] for h in listed] == ["running", "paused", "running"]
    assert all(h.metadata["owner"] == owner and h.lease_expires_at for h in listed)
    pages = fake_e2b.calls("GET", "/v2/sandboxes")
    assert len(pages) == 4 and all(r.query["state"] == "running,paused" for r in pages)
    assert all(fake_e2b.sandboxes[h.id].metadata[OWNER_METADATA_KEY] == owner for h in listed)
