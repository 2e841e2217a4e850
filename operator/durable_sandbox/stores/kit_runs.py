"""The store contract kit's cases of runs: create, read, list, change and delete (``stores/testing.py``)."""

from __future__ import annotations

import time

import pytest

from durable_sandbox.engine.errors import LeaseLost
from durable_sandbox.engine.records import Commit, ErrorInfo, Event, RunRecord, RunStatus
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.kit_base import TTL, StoreKit, rec, shape

__all__ = ["RunCases"]


class RunCases(StoreKit):
    """Runs: ``create_run`` is idempotent and round-trips every field; ``list_runs`` filters; ``update_run`` and
    ``delete_run`` are fenced when asked, and a deleted run takes its journal, events and signals with it."""

    async def test_create_run_is_idempotent_and_round_trips_fields(self, store: Store) -> None:
        run = RunRecord(
            run_id=self.run_id(),
            workflow="kit.flow",
            status=RunStatus.WAITING,
            input={"list": [1, "two", None, {"x": 1.5}], "unicode": "héllo ✓"},
            thread_id="thread-1",
            wake_at=1_900_000_000.5,
            pending_callbacks=["approve"],
            labels={"team": "kit"},
            workflow_ref="pkg.module:flow",
        )
        stored, created = await store.create_run(run)
        assert created and stored.run_id == run.run_id
        again, created = await store.create_run(RunRecord(run_id=run.run_id, workflow="other", input=None))
        assert not created, "create_run of an existing id must not create"
        assert again.workflow == "kit.flow" and again.input == run.input, "the first run must be kept, unchanged"
        got = await store.get_run(run.run_id)
        assert got is not None
        for name in ("workflow", "status", "input", "thread_id", "wake_at", "pending_callbacks", "labels",
                     "workflow_ref", "result", "error", "cancel_requested", "epoch"):
            assert getattr(got, name) == getattr(run, name), f"RunRecord.{name} did not round-trip"
        assert isinstance(got.status, RunStatus)
        assert await store.get_run(self.run_id("missing")) is None

    async def test_list_runs_filters_by_status_and_workflow_newest_first(self, store: Store) -> None:
        now = time.time()
        a = await self.new_run(store, "a", workflow="x", status=RunStatus.SUCCEEDED, created_at=now - 30)
        b = await self.new_run(store, "b", workflow="y", created_at=now - 20)
        c = await self.new_run(store, "c", workflow="x", status=RunStatus.WAITING, created_at=now - 10)
        assert [r.run_id for r in await store.list_runs()] == [c.run_id, b.run_id, a.run_id]
        assert [r.run_id for r in await store.list_runs(status=[RunStatus.PENDING])] == [b.run_id]
        pending_or_done = await store.list_runs(status=[RunStatus.PENDING, RunStatus.SUCCEEDED])
        assert {r.run_id for r in pending_or_done} == {a.run_id, b.run_id}
        assert [r.run_id for r in await store.list_runs(workflow="x")] == [c.run_id, a.run_id]
        assert [r.run_id for r in await store.list_runs(workflow="x", status=[RunStatus.WAITING])] == [c.run_id]
        assert [r.run_id for r in await store.list_runs(limit=2)] == [c.run_id, b.run_id]
        assert await store.list_runs(workflow="nobody") == []

    async def test_delete_run_removes_its_journal_events_and_signals_and_is_fenced(self, store: Store) -> None:
        gone = await self.new_run(store, "gone")
        kept = await self.new_run(store, "kept")
        for run in (gone, kept):
            lease = await store.claim(run.run_id, "w1", TTL)
            await store.commit(run.run_id, lease.fence, Commit([rec("a", "started"), rec("a")]))
            await store.put_signal(run.run_id, "cb", {"v": 1})
            await store.append_events([Event(run.run_id, "progress", {"message": "m"})])
            await store.release(lease)
        stale = await store.claim(gone.run_id, "w1", TTL)
        current = await store.claim(gone.run_id, "w1", TTL)  # a newer claim: the first lease is stale
        with pytest.raises(LeaseLost):
            await store.delete_run(gone.run_id, fence=stale.fence)
        assert await store.get_run(gone.run_id) is not None and len(await store.load_journal(gone.run_id)) == 2
        assert await store.delete_run(gone.run_id, fence=current.fence) is True
        assert await store.get_run(gone.run_id) is None
        assert await store.load_journal(gone.run_id) == [] and await store.read_events(gone.run_id) == []
        assert await store.get_signals(gone.run_id) == {}
        assert await store.delete_run(gone.run_id) is False  # already gone: nothing to do, no error
        # The other run is untouched.
        assert shape(await store.load_journal(kept.run_id)) == [("a", "started", None), ("a", "completed", None)]
        assert await store.get_signals(kept.run_id) == {"cb": {"v": 1}}
        assert len(await store.read_events(kept.run_id)) == 1
        assert [r.run_id for r in await store.list_runs()] == [kept.run_id]

    async def test_update_run_changes_fields_and_is_fenced_when_asked(self, store: Store) -> None:
        run = await self.new_run(store)
        await store.update_run(run.run_id, {"cancel_requested": "user asked", "labels": {"k": "v"}})
        got = await store.get_run(run.run_id)
        assert got is not None and got.cancel_requested == "user asked" and got.labels == {"k": "v"}
        assert got.updated_at >= run.updated_at
        old = await store.claim(run.run_id, "w1", TTL)
        new = await store.claim(run.run_id, "w1", TTL)
        with pytest.raises(LeaseLost):
            await store.update_run(run.run_id, {"status": RunStatus.FAILED}, fence=old.fence)
        assert (await store.get_run(run.run_id)).status == RunStatus.PENDING  # type: ignore[union-attr]
        await store.update_run(
            run.run_id,
            {"status": RunStatus.SUCCEEDED, "result": {"ok": True}, "error": ErrorInfo("E", "m", True)},
            fence=new.fence,
        )
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.SUCCEEDED and got.result == {"ok": True}
        assert got.error == ErrorInfo("E", "m", True)
