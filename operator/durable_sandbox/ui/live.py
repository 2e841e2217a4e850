"""Live timelines: one :class:`LiveTimeline` per run being looked at, read once and then tailed.

The run page fetches a run's whole timeline once (``/api/timeline``), then follows it over server-sent
events (``/api/timeline/stream``): every stream of the same run shares one :class:`LiveTimeline`, which
reads what the store has added since it last looked (``journal_since`` and ``read_events``, the calls
``Engine.stream`` is built on) at most once per ``poll_seconds``, folds it, and appends the items that
changed to a change log each stream sends on from its own position. A timeline that was dropped from the
cache and built again has a new ``gen``: a stream started against the old one tells its page to reload.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine import Event, OperationRecord
from durable_sandbox.ui.source import RunSource
from durable_sandbox.ui.timeline import Item, Timeline

__all__ = ["LiveTimeline", "Timelines"]

# A Workflow's Kubernetes Events are listed at most this often (one LIST each).
OBJECT_EVENTS_SECONDS = 3.0
# The newest timeline items a Sandbox's page keeps (a session may go on for days): older ones are counted, not
# shown; `dsb --kube history sandbox/NAME` prints every record.
SESSION_ITEMS = 2000


@dataclass
class LiveTimeline:
    ref: str
    run_id: str | None
    timeline: Timeline
    gen: str = field(default_factory=lambda: secrets.token_hex(6))
    log: list[Item] = field(default_factory=list)  # items in the order they changed (repeats allowed)
    journal: list[OperationRecord] = field(default_factory=list)  # every row read, in commit order
    rows: dict[str, list[OperationRecord]] = field(default_factory=dict)  # op id -> its rows (the record view)
    events: dict[str, Event] = field(default_factory=dict)  # item key -> the run event
    object_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    looked: float = 0.0  # monotonic time of the last read
    objects_looked: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def fold(self, rows: list[OperationRecord], events: list[Event], object_events: list[dict[str, Any]]) -> list[Item]:
        """Keep and fold what was read; the records of items the timeline dropped (its cap) go."""
        self.keep(rows, events, object_events)
        changed = self.timeline.feed(rows, events, object_events)
        for op in self.timeline.take_evicted():
            self.rows.pop(op, None)
        return changed

    def keep(self, rows: list[OperationRecord], events: list[Event], object_events: list[dict[str, Any]]) -> None:
        self.journal.extend(rows)
        for row in rows:
            self.rows.setdefault(row.op_id, []).append(row)
        for event in events:
            self.events[f"e{event.seq}"] = event
        for ev in object_events:
            self.object_events[f"k8s:{ev.get('uid')}"] = ev


class Timelines:
    """The live timelines of the runs being looked at, least recently used dropped first."""

    def __init__(self, source: RunSource, *, capacity: int = 4) -> None:  # a 10,000-call run: tens of MB
        self.source = source
        self.capacity = capacity
        self._cache: OrderedDict[str, LiveTimeline] = OrderedDict()
        self._building: dict[str, asyncio.Lock] = {}

    async def get(self, ref: str) -> LiveTimeline:
        live = self._cache.get(ref)
        if live is None:
            lock = self._building.setdefault(ref, asyncio.Lock())
            async with lock:  # two pages opening the same run read it once
                live = self._cache.get(ref)
                if live is None:
                    live = await self._build(ref)
                    self._cache[ref] = live
                    while len(self._cache) > self.capacity:
                        self._cache.popitem(last=False)
            self._building.pop(ref, None)
        self._cache.move_to_end(ref)
        return live

    async def _build(self, ref: str) -> LiveTimeline:
        head = await self.source.head(ref)
        run_id = head.run_id
        # A Sandbox's session calls: each with its caller's operation id, the newest SESSION_ITEMS kept.
        timeline = Timeline(head.created_at, session=head.session, cap=SESSION_ITEMS if head.session else None)
        live = LiveTimeline(ref, run_id, timeline)
        rows = await self.source.journal(run_id) if run_id else []
        events = await self.source.events(run_id, 0) if run_id else []
        objects = await self.source.object_events(ref)
        live.fold(rows, events, objects)
        live.looked = live.objects_looked = time.monotonic()
        return live

    async def refresh(self, live: LiveTimeline) -> None:
        """Fold what the store added since the last look (at most once per ``poll_seconds``)."""
        if time.monotonic() - live.looked < self.source.poll_seconds:
            return
        async with live.lock:
            now = time.monotonic()
            if now - live.looked < self.source.poll_seconds:
                return
            live.looked = now
            if live.run_id is None:  # the operator may have started the Workflow since
                live.run_id = (await self.source.head(live.ref)).run_id
            tl = live.timeline
            rows = await self.source.store.journal_since(live.run_id, tl.op_seq) if live.run_id else []
            events = await self.source.events(live.run_id, tl.ev_seq) if live.run_id else []
            objects: list[dict[str, Any]] = []
            if now - live.objects_looked >= OBJECT_EVENTS_SECONDS:
                live.objects_looked = now
                objects = await self.source.object_events(live.ref)
            live.log.extend(live.fold(rows, events, objects))
