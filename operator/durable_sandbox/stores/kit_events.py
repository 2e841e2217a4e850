"""The store contract kit's cases of the event feed (``stores/testing.py``)."""

from __future__ import annotations

import asyncio

from durable_sandbox.engine.records import Event
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.kit_base import StoreKit

__all__ = ["EventCases"]


class EventCases(StoreKit):
    """Events are ordered per run, and appends at once all land."""

    async def test_events_are_ordered_per_run(self, store: Store) -> None:
        run = await self.new_run(store)
        other = await self.new_run(store, "other")
        await store.append_events([])
        await store.append_events([Event(run.run_id, "progress", {"message": "hi"}), Event(run.run_id, "run.started")])
        await store.append_events([Event(other.run_id, "run.started")])
        await store.append_events([Event(run.run_id, f"e{i}", {"i": i}) for i in range(5)])
        events = await store.read_events(run.run_id)
        assert [e.type for e in events] == ["progress", "run.started", "e0", "e1", "e2", "e3", "e4"]
        assert events[0].data == {"message": "hi"} and events[2].data == {"i": 0}
        assert all(e.run_id == run.run_id for e in events)
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        assert [e.type for e in await store.read_events(run.run_id, after=events[1].seq)] == [
            "e0", "e1", "e2", "e3", "e4"]
        assert [e.type for e in await store.read_events(run.run_id, after=events[1].seq, limit=2)] == ["e0", "e1"]
        assert await store.read_events(run.run_id, after=events[-1].seq) == []
        assert [e.type for e in await store.read_events(other.run_id)] == ["run.started"]

    async def test_concurrent_event_appends_all_land(self, store: Store) -> None:
        run = await self.new_run(store)
        await asyncio.gather(*(store.append_events([Event(run.run_id, f"e{i}")]) for i in range(6)))
        events = await store.read_events(run.run_id)
        assert sorted(e.type for e in events) == [f"e{i}" for i in range(6)]
        assert len({e.seq for e in events}) == 6
