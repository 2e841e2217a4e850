"""The store contract kit's cases of a run ending and creating the next in one transaction (``stores/testing.py``;
``engine.store.CommitsWithNewRun``, what ``ctx.continue_as_new`` uses). Optional: skipped for a store without it."""

from __future__ import annotations

import pytest

from durable_sandbox.engine.errors import LeaseLost, RunConflict
from durable_sandbox.engine.records import Commit, RunRecord, RunStatus
from durable_sandbox.engine.store import CommitsWithNewRun, Store
from durable_sandbox.stores.kit_base import TTL, StoreKit, rec, shape

__all__ = ["NewRunCases"]


def _ending() -> Commit:
    return Commit([rec("last")], run={"status": RunStatus.SUCCEEDED, "result": {"continuedAsNew": "next"}})


class NewRunCases(StoreKit):
    """``commit_with_new_run``: the commit and the new run land together or not at all (a stale fence, a conflicting
    run of the new id: neither); offered again after it landed, the run it created is kept, not refused."""

    @staticmethod
    def _capable(store: Store) -> CommitsWithNewRun:
        if not isinstance(store, CommitsWithNewRun):
            pytest.skip("the store has no commit_with_new_run (optional: the engine creates the next run apart)")
        return store

    def _next(self, old: RunRecord, tag: str = "next") -> RunRecord:
        return RunRecord(run_id=self.run_id(tag), workflow=old.workflow, input={"n": 2},
                         labels={"durable-sandbox.dev/continued-from": old.run_id})

    async def test_commit_with_new_run_lands_both_together(self, store: Store) -> None:
        chain = self._capable(store)
        old = await self.new_run(store, "old")
        new = self._next(old)
        lease = await store.claim(old.run_id, "w1", TTL)
        await chain.commit_with_new_run(old.run_id, lease.fence, _ending(), new)
        ended, created = await store.get_run(old.run_id), await store.get_run(new.run_id)
        assert ended is not None and ended.status == RunStatus.SUCCEEDED, "the commit's run changes must land"
        assert shape(await store.load_journal(old.run_id)) == [("last", "completed", None)]
        assert created is not None and created.status == RunStatus.PENDING and created.input == {"n": 2}
        assert created.labels == new.labels and created.workflow == old.workflow
        # Offered again (an answer lost): the run it created is the same run, so it is kept and nothing is refused.
        await chain.commit_with_new_run(old.run_id, lease.fence, _ending(), new)
        again = await store.get_run(new.run_id)
        assert again is not None and again.input == {"n": 2} and again.labels == new.labels

    async def test_commit_with_new_run_writes_nothing_with_a_stale_fence(self, store: Store) -> None:
        chain = self._capable(store)
        old = await self.new_run(store, "old")
        new = self._next(old)
        stale = await store.claim(old.run_id, "w1", TTL)
        await store.claim(old.run_id, "w2", TTL, take_over_from="w1")
        with pytest.raises(LeaseLost):
            await chain.commit_with_new_run(old.run_id, stale.fence, _ending(), new)
        assert await store.get_run(new.run_id) is None, "a refused commit must not create the next run"
        assert await store.load_journal(old.run_id) == []
        assert (await store.get_run(old.run_id)).status == RunStatus.PENDING  # type: ignore[union-attr]

    async def test_commit_with_new_run_refuses_over_another_run_of_that_id(self, store: Store) -> None:
        chain = self._capable(store)
        old = await self.new_run(store, "old")
        other = await self.new_run(store, "other", input={"someone": "else"})
        lease = await store.claim(old.run_id, "w1", TTL)
        new = RunRecord(run_id=other.run_id, workflow=old.workflow, input={"n": 2},
                        labels={"durable-sandbox.dev/continued-from": old.run_id})
        with pytest.raises(RunConflict):
            await chain.commit_with_new_run(old.run_id, lease.fence, _ending(), new)
        assert await store.load_journal(old.run_id) == [], "the commit must not land without its new run"
        assert (await store.get_run(old.run_id)).status == RunStatus.PENDING  # type: ignore[union-attr]
        kept = await store.get_run(other.run_id)
        assert kept is not None and kept.input == {"someone": "else"}
