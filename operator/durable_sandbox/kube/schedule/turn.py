"""One turn of a WorkflowSchedule, carried out: read the record and the children, plan (``schedules.plan_turn``,
pure), then the effects in the order that keeps a tick from being doubled or lost: delete (Replace, history),
make the tick's Workflow (a create under its deterministic name: 409 is "made already"), and only then record the
tick (the ``schedule.created`` fault point sits between the two). A crash between the create and the record
leaves a Workflow the next turn finds by its name and owner uid: it is recorded, not made again."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine import faults
from durable_sandbox.kube.api.client import ApiException, KubeClient, brief, is_conflict, json_body
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.api.resources import (
    API_VERSION,
    GROUP,
    OPERATOR_FIELD_MANAGER,
    VERSION,
    WORKFLOWS,
    CustomObjects,
)
from durable_sandbox.kube.reporting.events import EventRecorder, LifecycleEvent
from durable_sandbox.kube.schedule.children import SEAL_ANNOTATION, owned_by, owner_reference, schedule_seal
from durable_sandbox.kube.schedule.record import SCHEDULE_LABEL, ScheduleRecord
from durable_sandbox.kube.spec.schedule_models import RECENT_MISSED
from durable_sandbox.schedules import ChildState, TurnPlan, tick_name

__all__ = ["CREATED_FAULT", "SCHEDULED_AT", "Made", "TurnEffects", "iso", "parse_time"]

log = logging.getLogger("durable_sandbox.kube.schedule")

CREATED_FAULT = "schedule.created"  # engine/faults.py: after a tick's Workflow is made, before it is recorded
SCHEDULED_AT = "durable-sandbox.dev/scheduled-at"  # annotation: the tick a Workflow was made for


def iso(when: dt.datetime | None) -> str | None:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if when is not None else None


def parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.UTC)
    except ValueError:
        return None


@dataclass
class Made:
    name: str | None = None  # the Workflow the due tick has (made now or before)
    uid: str | None = None  # when made in this turn (or found made): for status.active
    missed: list[dt.datetime] = field(default_factory=list)


@dataclass
class TurnEffects:
    api: KubeClient
    events: EventRecorder
    journal_key: bytes | None = None

    @property
    def objects(self) -> CustomObjects:
        return CustomObjects(self.api, field_manager=OPERATOR_FIELD_MANAGER)

    async def apply(self, body: Mapping[str, Any], plan: TurnPlan, record: ScheduleRecord) -> tuple[ScheduleRecord | None, Made]:
        """Carry ``plan`` out for the schedule ``body``: the record to write (None: unchanged), and what was made."""
        meta = body["metadata"]
        made_before = dict(record.made)
        for child in plan.delete:  # children are only ever what the record (or the seal) says the schedule made
            replaced = child.state == ChildState.ACTIVE
            await self.objects.delete(WORKFLOWS, meta["namespace"], child.name, uid=child.uid)
            made_before.pop(child.name, None)
            if replaced:
                await self._event(body, "Replaced", f"deleted Workflow {child.name}, still running, for a new tick "
                                  "(concurrencyPolicy Replace)")
        made = Made(missed=list(plan.missed))
        if plan.create is not None:
            made.name, made.uid = await self._make(body, plan.create)
            if made.name is None:
                made.missed.append(plan.create)
            else:
                faults.reach(CREATED_FAULT)
        elif plan.already_made is not None:
            made.name = tick_name(meta["name"], plan.already_made)
        if made.name is not None and made.uid:
            made_before[made.name] = made.uid
        if plan.record is None and not made.missed and made_before == record.made:
            return None, made
        new = ScheduleRecord(last_schedule_time=iso(plan.record) or record.last_schedule_time,
                             last_scheduled_workflow=made.name or record.last_scheduled_workflow,
                             missed_ticks=record.missed_ticks + len(made.missed),
                             recent_missed_ticks=[*record.recent_missed_ticks,
                                                  *(iso(t) or "" for t in made.missed)][-RECENT_MISSED:],
                             made=made_before)
        if made.missed:
            shown = ", ".join(iso(t) or "" for t in made.missed[-5:])
            more = " and more" if plan.more_missed else ""
            await self._event(body, "MissedTicks", f"{len(made.missed)}{more} tick(s) not run ({shown}): only the "
                              "newest due tick runs, and only within spec.startingDeadlineSeconds (or its name was "
                              "taken); see status.missedTicks", warning=True)
        return new, made

    async def _make(self, body: Mapping[str, Any], tick: dt.datetime) -> tuple[str | None, str | None]:
        """Create the tick's Workflow; its name and uid when it is the schedule's (made now, or made before and
        owned by the schedule's uid), None when another object holds the name (said in an Event; never adopted)."""
        meta = body["metadata"]
        namespace, schedule, uid = meta["namespace"], meta["name"], meta["uid"]
        name = tick_name(schedule, tick)
        template = (body.get("spec") or {}).get("workflowTemplate") or {}
        extra = template.get("metadata") or {}
        workflow = {
            "apiVersion": API_VERSION, "kind": "Workflow",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {**(extra.get("labels") or {}), SCHEDULE_LABEL: label_value(schedule)},
                         "annotations": {**(extra.get("annotations") or {}), SCHEDULED_AT: iso(tick),
                                         SEAL_ANNOTATION: schedule_seal(self.journal_key, namespace, uid, name)},
                         "ownerReferences": [owner_reference(schedule, uid)]},
            "spec": template.get("spec") or {},
        }
        try:
            created = await json_body(self.api.custom.create_namespaced_custom_object_without_preload_content(
                GROUP, VERSION, namespace, WORKFLOWS, workflow, field_manager=OPERATOR_FIELD_MANAGER))
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            existing = await self.objects.get(WORKFLOWS, namespace, name)
            seal = schedule_seal(self.journal_key, namespace, uid, name)
            if existing is not None and owned_by(existing, uid) and (
                    existing["metadata"].get("annotations") or {}).get(SEAL_ANNOTATION) == seal:
                return name, existing["metadata"]["uid"]  # made before (another replica, or this one before a crash)
            await self._event(body, "TickNameTaken", f"Workflow {name} exists and is not this schedule's (not made "
                              f"by the operator for schedule uid {uid}): the tick at {iso(tick)} was not run; delete "
                              "or rename that Workflow", warning=True)
            return None, None
        log.info("%s/%s: made Workflow %s for the tick at %s", namespace, schedule, name, iso(tick))
        await self._event(body, "Scheduled", f"made Workflow {name} for the tick at {iso(tick)}")
        return name, str(created.get("metadata", {}).get("uid") or "")

    async def _event(self, body: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        try:
            await self.events.emit(dict(body), LifecycleEvent(reason, message, "Warning" if warning else "Normal"))
        except Exception as exc:  # an Event is a notice
            log.warning("could not record event %s: %s", reason, brief(exc))
