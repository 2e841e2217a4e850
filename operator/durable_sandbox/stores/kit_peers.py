"""The store contract kit's cases of two instances over the same data (another process's view)
(``stores/testing.py``)."""

from __future__ import annotations

import asyncio

import pytest

from durable_sandbox.engine.errors import LeaseHeld, LeaseLost, SignalConflict
from durable_sandbox.engine.records import Commit, Lease, RunStatus
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.kit_base import TTL, StoreKit, rec, shape

__all__ = ["PeerCases"]


class PeerCases(StoreKit):
    """Two instances over the same data (the ``peer`` fixture): commits are seen and fenced across them."""

    async def test_a_peer_sees_commits_and_is_fenced(self, store: Store, peer: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, lease.fence, Commit([rec("a", "completed", 1)], run={"status": RunStatus.RUNNING}))
        assert shape(await peer.load_journal(run.run_id)) == [("a", "completed", 1)]
        got = await peer.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.RUNNING
        with pytest.raises(LeaseHeld):
            await peer.claim(run.run_id, "w2", TTL)
        await store.release(lease)
        taken = await peer.claim(run.run_id, "w2", TTL)
        with pytest.raises(LeaseLost):
            await store.commit(run.run_id, lease.fence, Commit([rec("b")]))
        await peer.commit(run.run_id, taken.fence, Commit([rec("b", "completed", 2)]))
        assert shape(await store.load_journal(run.run_id)) == [("a", "completed", 1), ("b", "completed", 2)]
        assert await peer.put_signal(run.run_id, "cb", 1) is True
        assert await store.put_signal(run.run_id, "cb", 1) is False
        with pytest.raises(SignalConflict):
            await store.put_signal(run.run_id, "cb", 2)

    async def test_peers_claiming_at_once_have_one_winner(self, store: Store, peer: Store) -> None:
        run = await self.new_run(store)
        results = await asyncio.gather(
            store.claim(run.run_id, "w1", TTL), peer.claim(run.run_id, "w2", TTL), return_exceptions=True
        )
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1 and isinstance(next(r for r in results if not isinstance(r, Lease)), LeaseHeld), results
        loser_store = peer if winners[0].owner == "w1" else store
        got = await loser_store.get_run(run.run_id)
        assert got is not None and got.fence == winners[0].fence

    async def test_peers_claim_next_never_hand_out_a_run_twice(self, store: Store, peer: Store) -> None:
        runs = {(await self.new_run(store, f"batch{i}")).run_id for i in range(6)}

        async def drain(s: Store, owner: str) -> list[str]:
            got: list[str] = []
            while (lease := await s.claim_next(owner, TTL)) is not None:
                got.append(lease.run_id)
            return got

        a, b = await asyncio.gather(drain(store, "w1"), drain(peer, "w2"))
        assert sorted(a + b) == sorted(runs), f"w1 took {a}, w2 took {b}"
