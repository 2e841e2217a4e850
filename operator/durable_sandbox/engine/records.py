"""Journal records and run records: the persisted shape of a run.

The journal is append-only: every status change of an operation (started, completed, failed) is a new
row, so the journal doubles as the run's event log and history keeps every attempt. The *state* of an
operation is its newest row. Storage grows with the number of operations, never with the size of state.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine.errors import error_details, is_retryable
from durable_sandbox.engine.owner import holder_is_dead


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    SUSPENDED = "suspended"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class OpStatus(enum.StrEnum):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"


class OpKind(enum.StrEnum):
    STEP = "step"
    PARALLEL = "parallel"
    CALLBACK = "callback"
    SLEEP = "sleep"
    PATCH = "patch"
    CHILD = "child"  # a child workflow started by the run (engine/children.py)
    UPDATE = "update"  # an update applied to the run (engine/updates.py), never entered by workflow code
    SANDBOX_PROVISION = "sandbox.provision"
    SANDBOX_CALL = "sandbox.call"
    SANDBOX_SNAPSHOT = "sandbox.snapshot"
    SANDBOX_SNAPSHOT_DELETE = "sandbox.snapshot_delete"
    SANDBOX_RESTORE = "sandbox.restore"
    SANDBOX_INJECT_LOSS = "sandbox.inject_loss"
    SANDBOX_DESTROY = "sandbox.destroy"


@dataclass(slots=True)
class ErrorInfo:
    type: str
    message: str
    retryable: bool = False
    details: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "message": self.message, "retryable": self.retryable}
        if self.details:
            out["details"] = self.details
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorInfo:
        return cls(data["type"], data["message"], bool(data.get("retryable")), data.get("details"))

    @classmethod
    def from_exception(cls, exc: BaseException, *, retryable: bool | None = None) -> ErrorInfo:
        return cls(
            type=type(exc).__name__,
            message=str(exc) or type(exc).__name__,
            retryable=is_retryable(exc) if retryable is None else retryable,
            details=error_details(exc),
        )


@dataclass(slots=True)
class OperationRecord:
    op_id: str
    kind: str
    name: str
    status: str
    attempt: int = 1
    input_digest: str | None = None
    result: Any = None
    error: ErrorInfo | None = None
    meta: dict[str, Any] | None = None
    ts: float = field(default_factory=time.time)
    epoch: int = 0  # the run's retry epoch when written; failures of an older epoch are retried
    seq: int = 0  # assigned by the store

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "opId": self.op_id,
            "kind": self.kind,
            "name": self.name,
            "status": self.status,
            "attempt": self.attempt,
            "inputDigest": self.input_digest,
            "ts": self.ts,
        }
        if self.status == OpStatus.COMPLETED:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error.to_json()
        if self.meta:
            out["meta"] = self.meta
        return out


@dataclass(slots=True)
class RunRecord:
    run_id: str
    workflow: str
    status: RunStatus = RunStatus.PENDING
    input: Any = None
    result: Any = None
    error: ErrorInfo | None = None
    thread_id: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    wake_at: float | None = None
    pending_callbacks: list[str] = field(default_factory=list)
    cancel_requested: str | None = None  # the reason, once cancel was asked for
    epoch: int = 0
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    fence: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    # Where the workflow function can be imported from ("pkg.module:function"), so a worker in another
    # process finds a workflow registered under a custom name.
    workflow_ref: str | None = None

    @property
    def stale(self) -> bool:
        """Recorded as running, but nobody executes it: its lease is gone or expired, or its holder is a
        dead process of this host. ``dsb resume`` (or a worker) takes it over."""
        if self.status != RunStatus.RUNNING:
            return False
        if self.lease_owner is None or self.lease_expires_at is None or self.lease_expires_at <= time.time():
            return True
        return holder_is_dead(self.lease_owner)


@dataclass(slots=True, frozen=True)
class Lease:
    run_id: str
    owner: str
    fence: int
    expires_at: float


@dataclass(slots=True)
class Commit:
    """Everything one journal transaction writes, atomically."""

    records: list[OperationRecord] = field(default_factory=list)
    run: dict[str, Any] | None = None  # RunRecord field changes
    thread_state: tuple[str, Any] | None = None  # (thread_id, state)
    cache: tuple[str, Any, float | None] | None = None  # (key, value, expires_at)
    check_cancel: bool = False  # refuse (RunCancelledError) when cancel was requested


@dataclass(slots=True)
class Event:
    """Run-level events that are not journal rows (progress, run status, sandbox notices)."""

    run_id: str
    type: str
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "runId": self.run_id, "type": self.type, "ts": self.ts, **self.data}
