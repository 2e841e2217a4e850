"""The store contract kit's damaged-row case (``stores/testing.py``)."""

from __future__ import annotations

import pytest

from durable_sandbox.engine.builds import BUILD_LABEL, BuildClaims
from durable_sandbox.engine.records import RunStatus
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.kit_base import TTL, StoreKit

__all__ = ["DamagedRowCases"]


class DamagedRowCases(StoreKit):
    """A damaged row (a cell written behind the store's back, a disk error, a bad restore) as every store reads it:
    one bad row never fails a listing, and the run says which of its cells are damaged, the same way on every store.
    Needs the :meth:`damage_run_cells` hook."""

    async def damage_run_cells(self, store: Store, run_id: str, cells: dict[str, str]) -> None:
        """Overwrite cells of run ``run_id``'s row with ``cells``' raw text (column name to text), as damage would.
        Override to run the damaged-row tests (a store without rows of text cells has nothing to damage)."""
        pytest.skip("the store kit's `damage_run_cells` hook is not supplied: the damaged-row tests need it")

    async def test_a_damaged_row_never_fails_a_listing_and_says_which_cells(self, store: Store) -> None:
        good = await self.new_run(store, "good", labels={"team": "a"})
        bad = await self.new_run(store, "bad", labels={"team": "b"})
        # JSON that does not parse, JSON of the wrong shape, an error that is none, a status no run has.
        await self.damage_run_cells(store, bad.run_id, {
            "result": "[1,", "labels": "[1]", "pending_callbacks": '{"x": 1}', "error": '"oops"', "status": "exploded",
        })
        listed = {r.run_id: r for r in await store.list_runs(limit=10)}
        assert set(listed) == {good.run_id, bad.run_id}
        assert listed[good.run_id].error is None and listed[good.run_id].labels == {"team": "a"}
        for damaged in (listed[bad.run_id], await store.get_run(bad.run_id)):
            assert damaged is not None and damaged.error is not None
            assert damaged.error.type == "StoreDamaged"
            assert damaged.error.message.startswith(f"Run {bad.run_id!r} in ")
            assert "damaged column(s) error, labels, pending_callbacks, result, status" in damaged.error.message
            assert "Restore the store from a backup" in damaged.error.message
            assert (damaged.status, damaged.result, damaged.labels, damaged.pending_callbacks) == (
                RunStatus.FAILED, None, {}, [])
            assert damaged.input == {"n": 1}  # an undamaged cell reads as it was

    async def test_a_damaged_labels_cell_never_fails_a_claim_for_a_build(self, store: Store) -> None:
        # claim_next for a build reads the runs' build labels: a labels cell that is not JSON reads as no labels
        # (as every read of the store reads it), and the other runs are still decided by their own.
        other = await self.new_run(store, "other", labels={BUILD_LABEL: "v2"})
        bad = await self.new_run(store, "bad", labels={"team": "b"})
        await self.damage_run_cells(store, bad.run_id, {"labels": "{not json"})
        build = BuildClaims("v1", frozenset({"kit.flow"}))
        lease = await store.claim_next("me", TTL, build=build)
        assert lease is not None and lease.run_id == bad.run_id
        assert await store.claim_next("me", TTL, build=build) is None  # the other build's run is never handed out
        again = await store.claim_next("any", TTL)
        assert again is not None and again.run_id == other.run_id
