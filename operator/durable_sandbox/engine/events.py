"""Turning journal rows into the events users stream (`Engine.stream`, `dsb logs -f`).

Lifecycle events come from the journal only (one event per recorded operation); extensions emit
separately just what the journal does not say (why a sandbox was lost, that it was hibernated). What an
extension's records mean is its own reader's to say (engine/extensions.py ``JournalReader``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.extensions import GENERIC_JOURNAL, JournalReader
from durable_sandbox.engine.records import Event, OperationRecord

if TYPE_CHECKING:
    from durable_sandbox.engine.store import Store


def journal_event(run_id: str, row: OperationRecord, reader: JournalReader = GENERIC_JOURNAL) -> dict[str, Any]:
    """The stream event of a journal row: ``<kind>.<status>`` (``callback.waiting``, ``step.retrying``), or
    what the reader of the extension that wrote it says (``sandbox.provisioned``, ``call.completed``). Its
    ``journalSeq`` is the row's place in the journal; run events count apart (``eventSeq``: :func:`run_event`)."""
    kind = row.kind
    status = row.status
    if status == "failed" and (row.meta or {}).get("nextAttemptAt") is not None:
        status = "retrying"
    elif kind == "callback" and status == "started":
        status = "waiting"
    out: dict[str, Any] = {
        "journalSeq": row.seq,
        "runId": run_id,
        "type": f"{kind}.{status}",
        "ts": row.ts,
        "opId": row.op_id,
        "kind": kind,
        "name": row.name,
        "attempt": row.attempt,
    }
    if row.error is not None:
        out["error"] = row.error.message
    target = reader.target(row)
    if target is not None:
        out["target"] = target
    out.update(reader.event(row) or {})
    return out


def run_event(event: Event) -> dict[str, Any]:
    """A run event as the stream gives it: its ``eventSeq`` counts run events, not journal rows."""
    out = event.to_json()
    out["eventSeq"] = out.pop("seq")
    return out


async def tail(
    store: Store,
    run_id: str,
    *,
    done: Callable[[], Awaitable[bool]],
    pause: Callable[[], Awaitable[None]],
    after: tuple[int, int] = (0, 0),
    on_row: Callable[[OperationRecord, dict[str, Any]], None] | None = None,
    reader: JournalReader = GENERIC_JOURNAL,
) -> AsyncIterator[dict[str, Any]]:
    """Journal rows (as operation events) and run events in time order, from ``after`` =
    (journal seq, event seq) on. ``done`` is asked *before* each read, and the tail ends at the first
    empty read after it said yes, so everything committed before the end condition is delivered.
    ``pause`` waits between empty reads; ``on_row`` may decorate each row's event."""
    op_seq, ev_seq = after
    targets: dict[str, str] = {}  # op id -> command or path, from started records, for their outcome's event
    while True:
        finished = await done()
        rows = await store.journal_since(run_id, op_seq)
        events = await store.read_events(run_id, ev_seq)
        merged: list[tuple[float, int, dict[str, Any]]] = []
        for r in rows:
            op_seq = max(op_seq, r.seq)
            event = journal_event(run_id, r, reader)
            if "target" in event:
                targets[r.op_id] = event["target"]
            elif r.op_id in targets:
                event["target"] = targets[r.op_id]
            if on_row is not None:
                on_row(r, event)
            merged.append((r.ts, 0, event))
        for e in events:
            ev_seq = max(ev_seq, e.seq)
            merged.append((e.ts, 1, run_event(e)))
        merged.sort(key=lambda m: (m[0], m[1]))
        for _, _, item in merged:
            yield item
        if rows or events:
            continue
        if finished:
            return
        await pause()
