"""Turning journal rows into the events users stream (`Engine.stream`, `dsb logs -f`).

Lifecycle events come from the journal only (one event per recorded operation); extensions emit
separately just what the journal does not say (why a sandbox was lost, that it was hibernated)."""

from __future__ import annotations

from typing import Any

from durable_sandbox.engine.records import OperationRecord

_SANDBOX_EVENTS = {
    "sandbox.provision": "sandbox.provisioned",
    "sandbox.snapshot": "sandbox.snapshot",
    "sandbox.snapshot_delete": "sandbox.snapshot_deleted",
    "sandbox.restore": "sandbox.recovered",
    "sandbox.inject_loss": "sandbox.loss_injected",
    "sandbox.destroy": "sandbox.destroyed",
}


def journal_event(run_id: str, row: OperationRecord) -> dict[str, Any]:
    kind = row.kind
    if kind.startswith("sandbox.") and kind != "sandbox.call" and row.status == "completed":
        etype = _SANDBOX_EVENTS.get(kind, kind)
        if kind == "sandbox.restore" and (row.meta or {}).get("reason") != "recovery":
            etype = "sandbox.restored"
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
    if kind == "sandbox.call" and row.status == "completed" and isinstance(row.result, dict):
        out["exitCode"] = row.result.get("exitCode")
    return out
