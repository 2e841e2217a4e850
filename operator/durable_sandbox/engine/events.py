"""Turning journal rows into the events users stream (`Engine.stream`, `dsb logs -f`).

Lifecycle events come from the journal only (one event per recorded operation); extensions emit
separately just what the journal does not say (why a sandbox was lost, that it was hibernated)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.records import OperationRecord

if TYPE_CHECKING:
    from durable_sandbox.engine.store import Store

_SANDBOX_EVENTS = {
    "sandbox.provision": "sandbox.provisioned",
    "sandbox.snapshot": "sandbox.snapshot",
    "sandbox.snapshot_delete": "sandbox.snapshot_deleted",
    "sandbox.restore": "sandbox.recovered",
    "sandbox.inject_loss": "sandbox.loss_injected",
    "sandbox.destroy": "sandbox.destroyed",
}


def call_target(row: OperationRecord) -> str | None:
    """What a sandbox call works on: a shell call's command, a file call's path (from its started record)."""
    call = (row.meta or {}).get("call") if row.kind == "sandbox.call" else None
    if not isinstance(call, dict) or not isinstance(call.get("args"), dict):
        return None
    target = call["args"].get("command" if call.get("type") == "shell" else "path")
    return target if isinstance(target, str) else None


def journal_event(run_id: str, row: OperationRecord) -> dict[str, Any]:
    kind = row.kind
    if kind.startswith("sandbox.") and kind != "sandbox.call" and row.status == "completed":
        etype = _SANDBOX_EVENTS.get(kind, kind)
        if kind == "sandbox.restore" and (row.meta or {}).get("reason") != "recovery":
            etype = "sandbox.restored"
        elif kind == "sandbox.destroy" and (row.meta or {}).get("finalized"):
            # The session's closing record (snapshots deleted, sandbox gone), not a second destroy.
            etype = "sandbox.finalized"
    else:
        base = "callback" if kind == "callback" else ("call" if kind == "sandbox.call" else kind)
        status = row.status
        if status == "failed" and (row.meta or {}).get("nextAttemptAt") is not None:
            status = "retrying"
        elif kind == "callback" and status == "started":
            status = "waiting"
        etype = f"{base}.{status}"
    out: dict[str, Any] = {
        "seq": row.seq,
        "runId": run_id,
        "type": etype,
        "ts": row.ts,
        "opId": row.op_id,
        "kind": kind,
        "name": row.name,
        "attempt": row.attempt,
    }
    if row.error is not None:
        out["error"] = row.error.message
    target = call_target(row)
    if target is not None:
        out["target"] = target
    if kind == "sandbox.call" and row.status == "completed" and isinstance(row.result, dict):
        out["exitCode"] = row.result.get("exitCode")
        for stream in ("stdout", "stderr"):
            if row.result.get(stream):
                out[stream] = row.result[stream]
    return out


async def tail(
    store: Store,
    run_id: str,
    *,
    done: Callable[[], Awaitable[bool]],
    pause: Callable[[], Awaitable[None]],
    after: tuple[int, int] = (0, 0),
    on_row: Callable[[OperationRecord, dict[str, Any]], None] | None = None,
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
            event = journal_event(run_id, r)
            if "target" in event:
                targets[r.op_id] = event["target"]
            elif r.op_id in targets:
                event["target"] = targets[r.op_id]
            if on_row is not None:
                on_row(r, event)
            merged.append((r.ts, 0, event))
        for e in events:
            ev_seq = max(ev_seq, e.seq)
            merged.append((e.ts, 1, e.to_json()))
        merged.sort(key=lambda m: (m[0], m[1]))
        for _, _, item in merged:
            yield item
        if rows or events:
            continue
        if finished:
            return
        await pause()
