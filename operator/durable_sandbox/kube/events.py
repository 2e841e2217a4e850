"""Kubernetes Events for a Workflow's lifecycle transitions, never one per call.

Reasons (CamelCase, as `kubectl describe` shows them): Provisioned, SnapshotTaken, SnapshotDeleted,
SandboxLost, Recovered, WaitingForSignal, Suspended, Resumed, Succeeded, Failed, Cancelled,
CleanupBlocked, CleanupDone, plus the operator's refusals (WorkflowNotAllowed, ProviderNotAllowed,
UnknownProvider, InvalidSpec). :func:`lifecycle_events` picks them out of newly committed journal rows;
:class:`EventRecorder` writes them, de-duplicated (the same reason and message for the same object is
written once per process; a repeated transition, e.g. a second snapshot, has a different message).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine.records import OperationRecord, OpKind

log = logging.getLogger("durable_sandbox.kube.events")

COMPONENT = "durable-sandbox-operator"
_DEDUP_CAPACITY = 10_000


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"


def lifecycle_events(rows: Iterable[OperationRecord]) -> list[LifecycleEvent]:
    """The lifecycle transitions among newly committed journal rows (sandbox sessions' records)."""
    out: list[LifecycleEvent] = []
    for row in rows:
        meta = row.meta or {}
        kind, status = row.kind, row.status
        if status == "completed" and kind == OpKind.SANDBOX_PROVISION.value and isinstance(row.result, dict):
            out.append(LifecycleEvent("Provisioned", f"sandbox {row.result.get('id')} provisioned ({row.name})"))
        elif status == "completed" and kind == OpKind.SANDBOX_SNAPSHOT.value and isinstance(row.result, dict):
            out.append(LifecycleEvent("SnapshotTaken", f"snapshot {row.result.get('snapshotId')} taken ({row.op_id})"))
        elif status == "completed" and kind == OpKind.SANDBOX_SNAPSHOT_DELETE.value:
            out.append(LifecycleEvent("SnapshotDeleted", f"snapshot {meta.get('snapshotId')} deleted"))
        elif status == "completed" and kind == OpKind.SANDBOX_DESTROY.value and meta.get("reason") == "lost":
            # Injected or real, a loss is recorded as the destruction of the lost sandbox before recovery.
            out.append(LifecycleEvent("SandboxLost", f"sandbox {meta.get('sandboxId')} lost; recovering", "Warning"))
        elif status == "completed" and kind == OpKind.SANDBOX_RESTORE.value and (meta.get("reason") == "recovery"):
            replayed = len(meta.get("replayed") or [])
            source = f"snapshot {meta.get('snapshotId')}" if meta.get("snapshotId") else "a fresh sandbox"
            result = row.result if isinstance(row.result, dict) else {}
            out.append(LifecycleEvent(
                "Recovered", f"recovered into sandbox {result.get('id')} from {source}, {replayed} call(s) replayed"
            ))
    return out


def run_status_event(phase: str, message: str) -> LifecycleEvent | None:
    """The event of a run entering ``phase`` (None for phases that are not lifecycle transitions)."""
    reason = {
        "Waiting": "WaitingForSignal",
        "Suspended": "Suspended",
        "Succeeded": "Succeeded",
        "Failed": "Failed",
        "Cancelled": "Cancelled",
    }.get(phase)
    if reason is None:
        return None
    return LifecycleEvent(reason, message, "Warning" if reason in ("Failed",) else "Normal")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Writes core/v1 Events about Workflows; ``core`` is ``kubernetes.aio``'s CoreV1Api."""

    def __init__(self, core: Any, *, instance: str) -> None:
        self.core = core
        self.instance = instance
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self.writes = 0

    async def emit(self, obj: dict[str, Any], event: LifecycleEvent) -> bool:
        """Write ``event`` about ``obj`` (a Workflow body); False if it was a duplicate or failed."""
        meta = obj.get("metadata", {})
        key = (meta.get("uid", ""), event.reason, event.message)
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > _DEDUP_CAPACITY:
            self._seen.popitem(last=False)
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'workflow')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "durable-sandbox.dev/v1alpha1"),
                "kind": obj.get("kind", "Workflow"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": event.reason,
            "message": event.message[:1024],
            "type": event.type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.core.create_namespaced_event(meta.get("namespace"), body)
        except Exception as exc:  # an Event is a notice: losing one must never stop a run
            log.warning("could not record event %s on %s/%s: %s", event.reason, meta.get("namespace"), meta.get("name"), exc)
            return False
        self.writes += 1
        return True
