"""The SQL stores' row codec: a run and a journal record to and from a row, the same for SQLite and PostgreSQL.

Both stores keep a run in one row of 18 columns and a journal record in one row of 12, JSON in text cells (and a
signal, an event, a thread's state and a cache entry in rows of their own). One codec, so the two stores cannot
disagree about a value, nor about a damaged cell:

- a damaged cell of a run's row (JSON that does not parse, an error that is not one, an unknown status) reads as
  empty, and the run's error says which columns are damaged, where, and what to do: one bad row never makes
  a run, or a listing of every run, unreadable;
- a damaged journal row is a ``StoreError`` naming it: a journal cannot be replayed around a hole.

``where`` is how the store names itself in a message (``Store /path/to/db``, ``PostgreSQL store host/db``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.errors import StoreError
from durable_sandbox.engine.records import ErrorInfo, Event, OperationRecord, RunRecord, RunStatus

__all__ = ["JSON_RUN_FIELDS", "OP_COLUMNS", "RUN_COLUMNS", "STORE_DAMAGED", "cache_row", "canonical", "change_value",
           "dumps", "event_from_row", "event_row", "loads", "op_cells", "op_from_row", "op_row", "run_from_row",
           "run_values", "signals_from_rows", "thread_row"]

RUN_COLUMNS = (
    "run_id", "workflow", "status", "input", "result", "error", "thread_id", "created_at", "updated_at", "wake_at",
    "pending_callbacks", "cancel_requested", "epoch", "lease_owner", "lease_expires_at", "fence", "labels",
    "workflow_ref",
)
OP_COLUMNS = ("seq", "op_id", "kind", "name", "status", "attempt", "digest", "result", "error", "meta", "ts", "epoch")
JSON_RUN_FIELDS = frozenset({"input", "result", "pending_callbacks", "labels"})
STORE_DAMAGED = "StoreDamaged"  # the error type of a run read from a row with damaged cells


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def canonical(value: Any) -> str:
    """A JSON value in one spelling (keys sorted): two signals are the same value when these are equal."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def run_values(run: RunRecord) -> tuple[Any, ...]:
    """A new run's row, in RUN_COLUMNS' order (no lease, fence 0)."""
    return (
        run.run_id, run.workflow, RunStatus(run.status).value, dumps(run.input), dumps(run.result),
        dumps(run.error.to_json()) if run.error else None, run.thread_id, run.created_at, run.updated_at,
        run.wake_at, dumps(run.pending_callbacks), run.cancel_requested, run.epoch, None, None, 0,
        dumps(run.labels), run.workflow_ref,
    )


def change_value(key: str, value: Any) -> Any:
    """The cell for a change of run field ``key`` (update_run, a commit's run changes)."""
    if key == "status":
        return RunStatus(value).value
    if key == "error":
        return dumps(value.to_json()) if value is not None else None
    if key in JSON_RUN_FIELDS:
        return dumps(value)
    return value


class _Cells:
    """The JSON cells of one run's row, read one by one; a damaged one reads as empty and is remembered."""

    def __init__(self) -> None:
        self.damaged: list[str] = []

    def json(self, column: str, text: str | None, empty: Any, kind: type | None = None) -> Any:
        try:
            value = loads(text) if text is not None else empty
        except ValueError:
            self.damaged.append(column)
            return empty
        if kind is not None and value is not None and not isinstance(value, kind):
            self.damaged.append(column)
            return empty
        return value

    def status(self, text: str) -> RunStatus:
        try:
            return RunStatus(text)
        except ValueError:
            self.damaged.append("status")
            return RunStatus.FAILED

    def error(self, text: str | None) -> ErrorInfo | None:
        value = self.json("error", text, None)
        try:
            return ErrorInfo.from_json(value) if value else None
        except (TypeError, KeyError, AttributeError, ValueError):
            self.damaged.append("error")
            return None


def run_from_row(row: Sequence[Any], where: str) -> RunRecord:
    """A run from its row (RUN_COLUMNS' order). Damaged cells read as empty; the run's error then names them."""
    (run_id, workflow, status, run_input, result, error, thread_id, created, updated, wake_at, pending,
     cancel, epoch, owner, expires, fence, labels, workflow_ref) = row
    cells = _Cells()
    run_status = cells.status(status)
    error_info = cells.error(error)
    pending_ids = cells.json("pending_callbacks", pending, [], list)
    run_labels = cells.json("labels", labels, {}, dict)
    run_input = cells.json("input", run_input, None)
    run_result = cells.json("result", result, None)
    if cells.damaged:
        error_info = ErrorInfo(
            STORE_DAMAGED,
            f"Run {run_id!r} in {where} has damaged column(s) {', '.join(sorted(cells.damaged))} (not valid JSON "
            f"or not a known value); they read as empty. Restore the store from a backup to recover them.",
        )
    return RunRecord(
        run_id=run_id, workflow=workflow, status=run_status, input=run_input, result=run_result, error=error_info,
        thread_id=thread_id, created_at=created, updated_at=updated, wake_at=wake_at, pending_callbacks=pending_ids,
        cancel_requested=cancel, epoch=epoch, lease_owner=owner, lease_expires_at=expires, fence=fence,
        labels=run_labels, workflow_ref=workflow_ref,
    )


def op_cells(record: OperationRecord) -> tuple[str | None, str | None, str | None]:
    """A journal record's JSON cells: (result, error, meta)."""
    return (
        dumps(record.result) if record.status == "completed" else None,
        dumps(record.error.to_json()) if record.error else None,
        dumps(record.meta) if record.meta else None,
    )


def op_row(record: OperationRecord) -> tuple[Any, ...]:
    """A journal record's cells without its run id and seq (the store sets those): OP_COLUMNS' order from op_id."""
    r = record
    return (r.op_id, r.kind, r.name, r.status, r.attempt, r.input_digest, *op_cells(r), float(r.ts), r.epoch)


def op_from_row(row: Sequence[Any], run_id: str, where: str) -> OperationRecord:
    """A journal record from its row (OP_COLUMNS' order); a damaged row is a StoreError saying where it is."""
    seq, op_id, kind, name, status, attempt, digest, result, error, meta, ts, epoch = row
    try:
        return OperationRecord(
            op_id=op_id, kind=kind, name=name, status=status, attempt=attempt, input_digest=digest,
            result=loads(result), error=ErrorInfo.from_json(json.loads(error)) if error else None,
            meta=loads(meta), ts=ts, epoch=epoch, seq=seq,
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StoreError(
            f"{where}: journal row {seq} ({op_id!r}) of run {run_id!r} is damaged ({exc}); the run cannot be "
            f"replayed or shown. Restore the store from a backup (docs/reliability.md)."
        ) from None


def event_row(event: Event) -> tuple[str, str, str, float]:
    """An event's cells: (run_id, type, data, ts); the store numbers it (seq)."""
    return event.run_id, event.type, dumps(event.data), float(event.ts)


def event_from_row(run_id: str, row: Sequence[Any]) -> Event:
    """An event of ``run_id`` from its row (seq, type, data, ts)."""
    seq, type_, data, ts = row
    return Event(run_id, type_, json.loads(data), ts, seq)


def signals_from_rows(rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """A run's signals from their rows (callback_id, value)."""
    return {row[0]: json.loads(row[1]) for row in rows}


def thread_row(thread_state: tuple[str, Any], now: float) -> tuple[str, str, float]:
    """A commit's thread state as its row: (thread_id, state, updated_at)."""
    thread_id, state = thread_state
    return thread_id, dumps(state), now


def cache_row(cache: tuple[str, Any, float | None], now: float) -> tuple[str, str, float, float | None]:
    """A commit's cache entry as its row: (key, value, created_at, expires_at)."""
    key, value, expires = cache
    return key, dumps(value), now, expires
