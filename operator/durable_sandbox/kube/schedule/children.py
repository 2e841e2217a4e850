"""The Workflows a schedule made: found by its label (a query narrowed, nothing proved), kept only when their
ownerReferences name the schedule's uid (what the operator wrote when it made them), and told active or finished
from their run's own record in the journal, never from their status (which others may write)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine import RunRecord, RunStatus
from durable_sandbox.kube.api.client import KubeClient, json_body
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.api.resources import API_VERSION, GROUP, VERSION, WORKFLOWS
from durable_sandbox.kube.schedule.record import SCHEDULE_LABEL
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.schedules import Child, ChildState

__all__ = ["ChildReader", "RunLookup", "owned_by", "owner_reference"]

# (namespace, run id) -> the run's record in the journal (None before the operator admitted the Workflow).
RunLookup = Callable[[str, str], Awaitable[RunRecord | None]]


def owner_reference(schedule: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "WorkflowSchedule", "name": schedule, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def owned_by(body: Mapping[str, Any], uid: str) -> bool:
    refs = body.get("metadata", {}).get("ownerReferences") or []
    return any(isinstance(r, dict) and r.get("uid") == uid and r.get("kind") == "WorkflowSchedule" for r in refs)


@dataclass
class ChildReader:
    api: KubeClient
    run_of: RunLookup
    # schedule uid -> Workflow uid -> its child, once finished (a finished run stays finished: read once)
    finished: dict[str, dict[str, Child]] = field(default_factory=dict)

    async def children(self, namespace: str, schedule: str, uid: str) -> list[Child]:
        listed = await json_body(self.api.custom.list_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, WORKFLOWS, label_selector=f"{SCHEDULE_LABEL}={label_value(schedule)}"))
        out = []
        known = self.finished.setdefault(uid, {})
        for body in listed.get("items") or []:
            if not owned_by(body, uid) or body.get("metadata", {}).get("deletionTimestamp"):
                continue
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
