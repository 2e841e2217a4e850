"""The event feed of a run (lifecycle, progress): ``dsb.K.events``, appended with a JSON Patch that ``test``s its
own counter, bounded (the oldest are dropped past ``EVENTS_BYTES``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.records import Event
from durable_sandbox.kube.api.client import ApiException, is_conflict, is_not_found, is_precondition_failed
from durable_sandbox.kube.journal.journal_objects import JournalObjects
from durable_sandbox.kube.store.codec import EVENTS_BYTES, RETRIES, dumps, jp, object_meta, run_key
from durable_sandbox.kube.store.heads import RunHeads


def _event_text(e: Event) -> str:
    return dumps({"t": e.type, "d": e.data, "ts": e.ts})


class EventFeed:
    """The event objects of one namespace's runs."""

    def __init__(self, heads: RunHeads) -> None:
        self.heads = heads
        self.objects = heads.objects

    async def append_events(self, events: Sequence[Event]) -> None:
        by_run: dict[str, list[Event]] = {}
        for e in events:
            by_run.setdefault(e.run_id, []).append(e)
        await asyncio.gather(*(self._append_run_events(run_id, evs) for run_id, evs in by_run.items()))

    async def _append_run_events(self, run_id: str, events: list[Event]) -> None:
        key = run_key(run_id)
        name = f"dsb.{key}.events"
        for _ in range(RETRIES):
            obj = await self.objects.get(name)
            if obj is None:
                if await self._create_feed(run_id, name, events):
                    return
                continue
            data = obj.get("data") or {}
            seq = int(data.get("seq", "0"))
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/data/seq", "value": str(seq)}]
            size = sum(len(v) for k, v in data.items() if k.startswith("e."))
            assigned = []
            for e in events:
                seq += 1
                text = _event_text(e)
                size += len(text)
                ops.append({"op": "add", "path": jp("data", f"e.{seq:012d}"), "value": text})
                assigned.append(seq)
            for k in sorted(k for k in data if k.startswith("e.")):  # bounded: drop the oldest
                if size <= EVENTS_BYTES:
                    break
                size -= len(data[k])
                ops.append({"op": "remove", "path": jp("data", k)})
            ops.append({"op": "replace", "path": "/data/seq", "value": str(seq)})
            try:
                await self.objects.patch(name, ops)
            except ApiException as exc:
                if is_precondition_failed(exc) or is_not_found(exc):
                    continue
                raise
            for e, s in zip(events, assigned, strict=True):
                e.seq = s
            return
        raise RuntimeError(f"Could not append events of run {run_id!r}: too many concurrent writers")

    async def _create_feed(self, run_id: str, name: str, events: list[Event]) -> bool:
        """Create the feed with ``events`` as its first; False when another writer created it first."""
        owners = await self.heads.owners(run_id)  # so the events go with the Workflow too
        data = {"seq": str(len(events))}
        for i, e in enumerate(events, 1):
            e.seq = i
            data[f"e.{i:012d}"] = _event_text(e)
        try:
            await self.objects.create(JournalObjects.body(object_meta(name, run_key(run_id), "events", owners), data))
        except ApiException as exc:
            if is_conflict(exc):
                return False
            raise
        return True

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        obj = await self.objects.get(f"dsb.{run_key(run_id)}.events")
        if obj is None:
            return []
        data = obj.get("data") or {}
        seqs = sorted(int(k[2:]) for k in data if k.startswith("e."))
        out = []
        for s in seqs:
            if s <= after:
                continue
            d = json.loads(data[f"e.{s:012d}"])
            out.append(Event(run_id, d["t"], d["d"], d["ts"], s))
            if len(out) >= limit:
                break
        return out
