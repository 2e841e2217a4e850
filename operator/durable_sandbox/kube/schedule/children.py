"""The Workflows a schedule made: found by its label (a query narrowed, nothing proved), kept only when their
ownerReferences name the schedule's uid and the schedule's sealed record holds their name and uid (what the
operator recorded when it made them), and told active or finished from their run's own record in the journal,
never from their status (which others may write).

One window is covered by a seal instead of the record: a Workflow made just before a crash, before its uid was
recorded. Each Workflow a schedule makes carries ``durable-sandbox.dev/schedule-seal``, an HMAC under the journal
key over the namespace, the schedule's uid and the Workflow's name; one with a valid seal, for a tick after the
last one recorded, and not yet in the record, is taken as made (and recorded). Any other Workflow with the
schedule's label or ownerReference is never counted, run or deleted."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine import RunRecord, RunStatus
from durable_sandbox.kube.api.client import KubeClient, json_body
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.api.resources import API_VERSION, GROUP, VERSION, WORKFLOWS
from durable_sandbox.kube.journal.sealing import Sealer
from durable_sandbox.kube.schedule.record import SCHEDULE_LABEL, ScheduleRecord
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.schedules import Child, ChildState

__all__ = ["SEAL_ANNOTATION", "ChildReader", "RunLookup", "owned_by", "owner_reference", "schedule_seal"]

SEAL_ANNOTATION = "durable-sandbox.dev/schedule-seal"

# (namespace, run id) -> the run's record in the journal (None before the operator admitted the Workflow).
RunLookup = Callable[[str, str], Awaitable[RunRecord | None]]


def owner_reference(schedule: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "WorkflowSchedule", "name": schedule, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def schedule_seal(key: bytes | None, namespace: str, schedule_uid: str, name: str) -> str:
    """The seal a schedule's Workflow ``name`` carries (without a journal key: the name, verifying nothing, as every
    seal of an operator run without a key)."""
    return Sealer(key, namespace).seal(schedule_uid, "workflow", name)


def _tick_of(name: str, schedule: str) -> dt.datetime | None:
    suffix = name.removeprefix(f"{schedule}-")
    return dt.datetime.fromtimestamp(int(suffix), dt.UTC) if suffix.isdigit() else None


def owned_by(body: Mapping[str, Any], uid: str) -> bool:
    refs = body.get("metadata", {}).get("ownerReferences") or []
    return any(isinstance(r, dict) and r.get("uid") == uid and r.get("kind") == "WorkflowSchedule" for r in refs)


@dataclass
class ChildReader:
    api: KubeClient
    run_of: RunLookup
    journal_key: bytes | None = None
    # schedule uid -> Workflow uid -> its child, once finished (a finished run stays finished: read once)
    finished: dict[str, dict[str, Child]] = field(default_factory=dict)

    def _made(self, body: Mapping[str, Any], namespace: str, schedule: str, uid: str, record: ScheduleRecord,
              last: dt.datetime | None) -> bool:
        meta = body.get("metadata", {})
        if not owned_by(body, uid) or meta.get("deletionTimestamp"):
            return False
        name = str(meta.get("name"))
        if name in record.made:
            return record.made[name] == meta.get("uid")
        tick = _tick_of(name, schedule)
        sealed = (meta.get("annotations") or {}).get(SEAL_ANNOTATION) == schedule_seal(self.journal_key, namespace,
                                                                                       uid, name)
        return sealed and tick is not None and (last is None or tick > last)  # made just before a crash

    async def children(self, namespace: str, schedule: str, uid: str, record: ScheduleRecord,
                       last: dt.datetime | None) -> list[Child]:
        """The schedule's Workflows (``record``: its sealed record; ``last``: the last tick it recorded)."""
        listed = await json_body(self.api.custom.list_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, WORKFLOWS, label_selector=f"{SCHEDULE_LABEL}={label_value(schedule)}"))
        out = []
        known = self.finished.setdefault(uid, {})
        for body in listed.get("items") or []:
            if self._made(body, namespace, schedule, uid, record, last):
                out.append(await self._child(namespace, body, known))
        alive = {c.uid for c in out}
        for gone in set(known) - alive:
            del known[gone]
        return out

    def forget(self, uid: str) -> None:
        """The schedule ``uid`` is no longer served here."""
        self.finished.pop(uid, None)

    async def _child(self, namespace: str, body: Mapping[str, Any], finished: dict[str, Child]) -> Child:
        meta = body["metadata"]
        known = finished.get(meta["uid"])
        if known is not None:
            return known
        run = await self.run_of(namespace, cluster_run_id(meta["name"], meta["uid"]))  # not status.runId: forgeable
        if run is None or not run.status.terminal:
            return Child(name=meta["name"], uid=meta["uid"], state=ChildState.ACTIVE)
        state = ChildState.SUCCEEDED if run.status == RunStatus.SUCCEEDED else ChildState.FAILED
        child = Child(name=meta["name"], uid=meta["uid"], state=state,
                      finished_at=dt.datetime.fromtimestamp(run.updated_at, dt.UTC))
        finished[meta["uid"]] = child
        return child
