"""Kubernetes Events for a Workflow's lifecycle transitions, never one per call.

Reasons (CamelCase, as `kubectl describe` shows them): Provisioned, SnapshotTaken, SnapshotDeleted,
SandboxLost, Recovered, WaitingForSignal, Suspended, Resumed, Retrying, Succeeded, Failed, Cancelled,
CleanupBlocked, CleanupDone, plus the operator's refusals (WorkflowNotAllowed, ProviderNotAllowed,
UnknownProvider, InvalidSpec). :func:`lifecycle_events` picks them out of newly committed journal rows;
:class:`EventRecorder` writes them, de-duplicated (the same reason and message for the same object is
written once per process; a repeated transition, e.g. a second snapshot, has a different message).

The end of a run (Succeeded, Failed, Cancelled) is written once across replicas and restarts: its Event has
a name derived from the Workflow, the reason and the run's epoch (:func:`terminal_event`), so when a second
replica (re-activating a finished run whose status it saw stale) or a restarted one writes it again, the API
server answers 409 AlreadyExists and nothing is added. Its name is the same for every writer; its content is
the first writer's, usually the replica that executed the run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.api.client import brief
from durable_sandbox.sandboxes import journal

log = logging.getLogger("durable_sandbox.kube.reporting.events")

COMPONENT = "durable-sandbox-operator"
_DEDUP_CAPACITY = 10_000


TERMINAL_REASONS = frozenset({"Succeeded", "Failed", "Cancelled"})
_NAME_MAX = 253  # an Event's name is a DNS subdomain


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"
    name: str | None = None  # a fixed Event name: written once by whichever replica writes it first


def lifecycle_events(rows: Iterable[OperationRecord]) -> list[LifecycleEvent]:
    """The lifecycle transitions among newly committed journal rows (sandbox sessions' records)."""
    out: list[LifecycleEvent] = []
    for row in rows:
        if row.status != "completed":
            continue
        made = journal.provisioned(row)
        if made is not None and row.kind == journal.PROVISION:
            out.append(LifecycleEvent("Provisioned", f"sandbox {made.sandbox_id} provisioned ({row.name})"))
        elif (taken := journal.snapshot_taken(row)) is not None:
            out.append(LifecycleEvent("SnapshotTaken", f"snapshot {taken} taken ({row.op_id})"))
        elif row.kind == journal.SNAPSHOT_DELETE:
            out.append(LifecycleEvent("SnapshotDeleted", f"snapshot {journal.deletion_of(row)} deleted"))
        elif (lost := journal.lost_sandbox(row)) is not None:
            # Injected or real, a loss is recorded as the destruction of the lost sandbox before recovery.
            out.append(LifecycleEvent("SandboxLost", f"sandbox {lost} lost; recovering", "Warning"))
        elif made is not None and made.recovery:
            source = f"snapshot {journal.restored_from(row)}" if journal.restored_from(row) else "a fresh sandbox"
            out.append(LifecycleEvent("Recovered", f"recovered into sandbox {made.sandbox_id} from {source}, "
                                                   f"{journal.replay_summary(row)}"))
    return out


def run_status_event(phase: str, message: str) -> LifecycleEvent | None:
    """The event of a run entering ``phase`` (None for phases that are not lifecycle transitions)."""
    reason = {
        "Waiting": "WaitingForSignal",
        "Suspended": "Suspended",
        "Succeeded": "Succeeded",
        "Failed": "Failed",
        "Cancelled": "Cancelled",
        "Retrying": "Retrying",  # one per retry: an attempt failed and another will start
    }.get(phase)
    if reason is None:
        return None
    return LifecycleEvent(reason, message, "Warning" if reason in ("Failed", "Retrying") else "Normal")


def terminal_event(event: LifecycleEvent, *, workflow: str, uid: str, epoch: int) -> LifecycleEvent:
    """``event`` (the end of a run) under a name every replica derives alike: ``<workflow>.<digest>`` of the
    Workflow's uid, the reason and the run's epoch (a failed run that is retried ends again in a new epoch)."""
    digest = hashlib.sha256(f"{uid}\0{event.reason}\0{epoch}".encode()).hexdigest()[:16]
    # "z": after every other Event of the Workflow in name order (theirs are hex times), see EventRecorder.emit.
    return LifecycleEvent(event.reason, event.message, event.type, name=_event_name(workflow, f"z{digest}"))


def _event_name(workflow: str, suffix: str) -> str:
    return f"{workflow[: _NAME_MAX - len(suffix) - 1].rstrip('.-')}.{suffix}"


class EventRecorder:
    """Writes core/v1 Events about Workflows; ``core`` is ``kubernetes.aio``'s CoreV1Api, ``away`` where an API
    server that does not answer is reported (said once)."""

    def __init__(self, core: Any, *, instance: str, away: ApiServerAway | None = None) -> None:
        self.core = core
        self.away = away if away is not None else ApiServerAway()
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
        # `kubectl describe` orders Events by lastTimestamp, which has whole seconds, and keeps the API server's
        # order (by name) among Events of one second: a run's SnapshotTaken and SnapshotDeleted came out in any
        # order. Named as the kubelet names its Events, <object>.<time in ns, hex>, they list as they happened;
        # eventTime carries the microseconds for the clients that read it.
        now = dt.datetime.now(dt.UTC)
        seconds, micros = now.strftime("%Y-%m-%dT%H:%M:%SZ"), now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        name = event.name or _event_name(str(meta.get("name") or "workflow"), f"{time.time_ns():x}")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta.get("namespace")},
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
            "reportingInstance": self.instance[:128] or COMPONENT,
            "action": event.reason[:128],  # required of an Event with an eventTime: what the operator did
            "eventTime": micros,
            "firstTimestamp": seconds,
            "lastTimestamp": seconds,
            "count": 1,
        }
        try:
            await self.core.create_namespaced_event(meta.get("namespace"), body)
        except Exception as exc:  # an Event is a notice: losing one must never stop a run
            if event.name and getattr(exc, "status", None) == 409:
                return False  # written already: by another replica, or by this one before a restart
            if not self.away.unreachable(exc, f"an Event on {meta.get('namespace')}/{meta.get('name')}"):
                log.warning("could not record event %s on %s/%s: %s", event.reason, meta.get("namespace"),
                            meta.get("name"), brief(exc))
            return False
        self.writes += 1
        return True
