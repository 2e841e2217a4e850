"""The store contract kit's cases of leases and ``claim_next`` (``stores/testing.py``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from durable_sandbox.engine.builds import BUILD_LABEL, PAST_BUILDS_LABEL, BuildClaims
from durable_sandbox.engine.errors import LeaseHeld, LeaseLost, RunNotFound
from durable_sandbox.engine.records import Commit, Lease, RunStatus
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.kit_base import TTL, StoreKit, rec

__all__ = ["LeaseCases"]


class LeaseCases(StoreKit):
    """Leases: every claim moves the fence, a stale lease can neither renew nor release, an expired one can be
    taken; ``claim_next`` picks pending, due and orphaned runs and nothing else."""

    async def test_claim_takes_a_free_run_and_every_claim_moves_the_fence(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        assert lease.run_id == run.run_id and lease.owner == "w1" and lease.fence > run.fence
        assert lease.expires_at > time.time()
        got = await store.get_run(run.run_id)
        assert got is not None and got.fence == lease.fence and got.lease_owner == "w1"
        with pytest.raises(LeaseHeld) as info:
            await store.claim(run.run_id, "w2", TTL)
        assert info.value.owner == "w1" and "w1" in str(info.value)
        again = await store.claim(run.run_id, "w1", TTL)  # the owner may re-claim; the fence still moves
        assert again.fence > lease.fence
        with pytest.raises(RunNotFound):
            await store.claim(self.run_id("missing"), "w1", TTL)

    async def test_take_over_from_takes_a_lease_only_from_the_named_holder(self, store: Store) -> None:
        run = await self.new_run(store)
        dead = await store.claim(run.run_id, "w1", TTL)
        with pytest.raises(LeaseHeld):
            await store.claim(run.run_id, "w2", TTL, take_over_from="w3")  # not who holds it
        taken = await store.claim(run.run_id, "w2", TTL, take_over_from="w1")  # the holder the caller proved dead
        assert taken.owner == "w2" and taken.fence > dead.fence
        with pytest.raises(LeaseLost):
            await store.renew(dead, TTL)
        with pytest.raises(LeaseHeld):
            await store.claim(run.run_id, "w3", TTL, take_over_from="w1")  # w2 holds it now: never displaced

    async def test_expired_lease_can_be_claimed_and_fences_the_old_holder(self, store: Store) -> None:
        run = await self.new_run(store)
        old = await store.claim(run.run_id, "w1", TTL)
        await self.expire_lease(store, old)
        new = await store.claim(run.run_id, "w2", TTL)
        assert new.owner == "w2" and new.fence > old.fence
        got = await store.get_run(run.run_id)
        assert got is not None and got.lease_owner == "w2" and got.fence == new.fence
        with pytest.raises(LeaseLost):
            await store.commit(run.run_id, old.fence, Commit([rec("late")]))
        with pytest.raises(LeaseLost):
            await store.renew(old, TTL)

    async def test_renew_extends_only_the_current_lease(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        renewed = await store.renew(lease, 100)
        assert renewed.fence == lease.fence and renewed.owner == "w1"
        assert renewed.expires_at > lease.expires_at
        await store.commit(run.run_id, renewed.fence, Commit([rec("a")]))  # renewal keeps the fence valid
        newer = await store.claim(run.run_id, "w1", TTL)
        with pytest.raises(LeaseLost):
            await store.renew(lease, TTL)
        await store.renew(newer, TTL)

    async def test_release_frees_the_run_at_once_but_a_stale_release_does_not(self, store: Store) -> None:
        run = await self.new_run(store)
        old = await store.claim(run.run_id, "w1", TTL)
        new = await store.claim(run.run_id, "w1", TTL)  # the holder re-claims: ``old`` is now stale
        await store.release(old)  # stale: must not free the current lease
        with pytest.raises(LeaseHeld):
            await store.claim(run.run_id, "w3", TTL)
        await store.release(new)
        taken = await store.claim(run.run_id, "w3", TTL)  # no waiting for an expiry after a release
        assert taken.owner == "w3" and taken.fence > new.fence
        with pytest.raises(LeaseLost):
            await store.commit(run.run_id, new.fence, Commit([rec("after-release")]))

    async def test_concurrent_claims_have_one_winner(self, store: Store) -> None:
        run = await self.new_run(store)
        results = await asyncio.gather(
            *(store.claim(run.run_id, f"w{i}", TTL) for i in range(4)), return_exceptions=True
        )
        winners = [r for r in results if isinstance(r, Lease)]
        losers = [r for r in results if not isinstance(r, Lease)]
        assert len(winners) == 1, f"expected exactly one winner, got {results}"
        assert all(isinstance(e, LeaseHeld) for e in losers), losers
        got = await store.get_run(run.run_id)
        assert got is not None and got.fence == winners[0].fence

    # ------------------------------------------------------------------ claim_next

    async def test_claim_next_picks_pending_due_and_orphaned_runs(self, store: Store) -> None:
        now = time.time()
        pending = await self.new_run(store, "pending")
        due = await self.new_run(store, "due", status=RunStatus.WAITING, wake_at=now - 1)
        await self.new_run(store, "not-due", status=RunStatus.WAITING, wake_at=now + 3600)
        await self.new_run(store, "waiting-forever", status=RunStatus.WAITING)
        await self.new_run(store, "suspended", status=RunStatus.SUSPENDED)
        await self.new_run(store, "done", status=RunStatus.SUCCEEDED)
        await self.new_run(store, "failed", status=RunStatus.FAILED)
        await self.new_run(store, "cancelled", status=RunStatus.CANCELLED)
        orphan = await self.new_run(store, "orphan", status=RunStatus.RUNNING)
        busy = await self.new_run(store, "busy", status=RunStatus.RUNNING)
        busy_pending = await self.new_run(store, "busy-pending")
        cancel = await self.new_run(store, "cancel", status=RunStatus.WAITING, cancel_requested="stop")
        dead = await store.claim(orphan.run_id, "dead-worker", TTL)
        await store.claim(busy.run_id, "live-worker", 3600)
        await store.claim(busy_pending.run_id, "live-worker", 3600)
        await self.expire_lease(store, dead)  # the dead worker's lease runs out; the live ones do not

        claimed: dict[str, Lease] = {}
        while (lease := await store.claim_next("me", TTL)) is not None:
            assert lease.owner == "me" and lease.run_id not in claimed, f"claimed {lease.run_id} twice"
            claimed[lease.run_id] = lease
            assert len(claimed) <= 10, "claim_next keeps returning runs"
        assert set(claimed) == {pending.run_id, due.run_id, orphan.run_id, cancel.run_id}
        assert claimed[orphan.run_id].fence > dead.fence
        with pytest.raises(LeaseLost):
            await store.commit(orphan.run_id, dead.fence, Commit([rec("zombie")]))
        got = await store.get_run(pending.run_id)
        assert got is not None and got.fence == claimed[pending.run_id].fence

    async def test_claim_next_filters_by_workflow(self, store: Store) -> None:
        await self.new_run(store, "a", workflow="alpha")
        b = await self.new_run(store, "b", workflow="beta")
        lease = await store.claim_next("me", TTL, workflows=["beta", "gamma"])
        assert lease is not None and lease.run_id == b.run_id
        assert await store.claim_next("me", TTL, workflows=["beta"]) is None
        assert await store.claim_next("me", TTL, workflows=["gamma"]) is None

    async def test_claim_next_skips_runs_pinned_to_another_build(self, store: Store) -> None:
        # A worker of build v1.2 that has imported kit.pinned (not auto-upgrade); kit.flow may be auto-upgrade.
        build = BuildClaims("v1.2", frozenset({"kit.pinned"}))
        runs = {
            "unpinned": {},
            "blank": {BUILD_LABEL: ""},
            "own": {BUILD_LABEL: "v1.2", PAST_BUILDS_LABEL: "v0"},
            "other-upgradable": {BUILD_LABEL: "v2", PAST_BUILDS_LABEL: "v0,v1x2,V1.2,v1.2-rc"},  # near misses
            "moved-on": {BUILD_LABEL: "v2", PAST_BUILDS_LABEL: "v0,v1.2"},  # never back to an older build
            "moved-on-first": {BUILD_LABEL: "v3", PAST_BUILDS_LABEL: "v1.2,v2"},
            "other-pinned": {BUILD_LABEL: "v2", "kit.workflow": "kit.pinned"},
            "own-pinned": {BUILD_LABEL: "v1.2", "kit.workflow": "kit.pinned"},
        }
        made = {tag: await self.new_run(store, tag, workflow=labels.get("kit.workflow", "kit.flow"), labels=labels)
                for tag, labels in runs.items()}
        claimed: set[str] = set()
        while (lease := await store.claim_next("me", TTL, build=build)) is not None:
            assert lease.run_id not in claimed and len(claimed) < len(made), f"claimed {lease.run_id} twice"
            claimed.add(lease.run_id)
        admitted = {run.run_id for run in made.values() if build.admits(run)}  # engine/builds.py's decision
        assert claimed == admitted, "claim_next and BuildClaims.admits disagree"
        assert claimed == {made[t].run_id for t in ("unpinned", "blank", "own", "other-upgradable", "own-pinned")}
        left = {run.run_id for run in made.values()} - claimed
        others: set[str] = set()
        while (lease := await store.claim_next("any", TTL)) is not None:  # an unversioned worker takes any run
            others.add(lease.run_id)
            assert len(others) <= len(left), "claim_next keeps returning runs"
        assert others == left

    async def test_claim_next_with_nothing_runnable_returns_none(self, store: Store) -> None:
        assert await store.claim_next("me", TTL) is None
        await self.new_run(store, "done", status=RunStatus.SUCCEEDED)
        assert await store.claim_next("me", TTL) is None
