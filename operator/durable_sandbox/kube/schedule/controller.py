"""Reconciliation of ``WorkflowSchedule`` resources, without kopf: make a Workflow from the template at each tick.

kopf (``kube/handlers.py``) runs :meth:`ScheduleController.daemon` once per schedule and :meth:`notice` on every
watch event. The daemon sleeps until the next tick (or a spec change, or ``poll`` seconds at most, so a Workflow
ending under Forbid is seen), then runs a turn (``kube/schedule/turn.py``). One replica at a time: the turn runs
only in the replica holding the schedule's lease (``dsbsched.<uid>``, a Journal object as for SandboxPools,
``kube/journal/leases.py``); the deterministic Workflow names make a tick single even without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.kube.api.client import KubeClient, brief
from durable_sandbox.kube.api.objects import ObjectView
from durable_sandbox.kube.api.resources import API_VERSION, OPERATOR_FIELD_MANAGER, SCHEDULES, CustomObjects
from durable_sandbox.kube.journal.leases import HeldLease, LeaseBusy, ObjectLeases
from durable_sandbox.kube.reporting.events import EventRecorder
from durable_sandbox.kube.schedule.children import ChildReader, RunLookup
from durable_sandbox.kube.schedule.record import SCHEDULE_LABEL, ScheduleRecord, ScheduleRecords
from durable_sandbox.kube.schedule.turn import TurnEffects, iso, parse_time
from durable_sandbox.kube.spec.conditions import State, merge
from durable_sandbox.kube.spec.schedule_models import SCHEDULE_CONDITIONS, WorkflowScheduleSpec
from durable_sandbox.schedules import NAME_MAX, ChildState, TurnPlan, plan_turn

log = logging.getLogger("durable_sandbox.kube.schedule")

__all__ = ["ScheduleController", "ScheduleSettings"]


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class ScheduleSettings:
    poll: float = 30.0  # the longest sleep between turns (a tick far off; children's ends under Forbid)
    waiting_poll: float = 2.0  # while a due tick waits for a running Workflow (Forbid)
    retry: float = 5.0  # after an error (the API server, an invalid spec)
    worker_id: str = "durable-sandbox"
    lease_ttl: float = 15.0
    clock: Callable[[], dt.datetime] = _utc_now


@dataclass(kw_only=True)
class ScheduleView(ObjectView):
    lease: HeldLease | None = None
    status: dict[str, Any] = field(default_factory=dict)  # as last written by this replica


class ScheduleController:
    def __init__(self, api: KubeClient, events: EventRecorder, run_of: RunLookup, journal_key: bytes | None,
                 settings: ScheduleSettings | None = None) -> None:
        self.api = api
        self.objects = CustomObjects(api, field_manager=OPERATOR_FIELD_MANAGER)
        self.settings = settings or ScheduleSettings()
        self.records = ScheduleRecords(api, journal_key)
        self.children = ChildReader(api, run_of, journal_key)
        self.effects = TurnEffects(api, events, journal_key)
        self._views: dict[str, ScheduleView] = {}
        self._leases = ObjectLeases(api, field_manager=OPERATOR_FIELD_MANAGER, api_version=API_VERSION,
                                    kind="WorkflowSchedule", prefix="dsbsched", name_label=SCHEDULE_LABEL)

    def notice(self, body: Mapping[str, Any]) -> None:
        view = self._views.get(body.get("metadata", {}).get("uid", ""))
        if view is not None:
            view.notice(body)

    async def daemon(self, body_of: Callable[[], Mapping[str, Any]], stopped: asyncio.Event) -> None:
        body = body_of()
        meta = body["metadata"]
        view = self._views.setdefault(meta["uid"], ScheduleView(namespace=meta["namespace"], name=meta["name"],
                                                                uid=meta["uid"], body=body, body_of=body_of,
                                                                status=dict(body.get("status") or {})))
        try:
            while not stopped.is_set() and not view.deleting:
                view.wake.clear()
                delay = await self._hold(view)
                if delay is None:
                    delay = await self.turn(view)
                await view.wait(stopped, delay)
        finally:
            self._views.pop(view.uid, None)
            self.children.forget(view.uid)
            if view.lease is not None and view.lease.held and not view.deleting:
                with contextlib.suppress(Exception):
                    await view.lease.release()  # hand it over at once (SIGTERM, rolling update)

    async def _hold(self, view: ScheduleView) -> float | None:
        if view.lease is None:
            view.lease = self._leases.lease(view.namespace, view.name, view.uid, holder=self.settings.worker_id,
                                            ttl=self.settings.lease_ttl)
        if view.lease.held:
            return None
        try:
            await view.lease.take()
        except LeaseBusy as busy:
            return max(0.5, min(busy.remaining, self.settings.lease_ttl))
        except Exception as exc:
            log.warning("schedule %s/%s: cannot take its lease: %s", view.namespace, view.name, brief(exc))
            return self.settings.retry
        return None

    async def turn(self, view: ScheduleView) -> float:
        """One turn; the seconds until the next."""
        body = view.latest()
        generation = body.get("metadata", {}).get("generation")
        view.generation = generation
        try:
            spec = WorkflowScheduleSpec.model_validate(body.get("spec") or {})
            if len(view.name) > NAME_MAX:
                raise ValueError(f"the name is longer than {NAME_MAX} characters")
        except (ValidationError, ValueError) as exc:
            await self._status(view, generation, {"Ready": (False, "InvalidSpec", spec_problem(exc))})
            return self.settings.retry
        try:
            record = await self.records.read(view.namespace, view.uid)
            last = parse_time(record.last_schedule_time)
            children = await self.children.children(view.namespace, view.name, view.uid, record, last)
            record.made = {c.name: c.uid for c in children}  # the made ones still there (and one sealed in a crash)
            now = self.settings.clock()
            since = last or parse_time(body["metadata"].get("creationTimestamp"))
            plan = plan_turn(view.name, spec.timing(), spec.policy(), now=now, since=since or now, children=children)
            written, made = await self.effects.apply(body, plan, record)
            if written is not None:
                await self.records.write(view.namespace, view.name, view.uid, written)
                record = written
        except JournalDamaged as exc:
            await self._status(view, generation, {"Ready": (False, "RecordDamaged", str(exc))})
            return self.settings.retry
        except Exception as exc:  # the API server: said in status, tried again
            log.warning("schedule %s/%s: %s", view.namespace, view.name, brief(exc))
            await self._status(view, generation, {"Ready": (False, "ReconcileError", brief(exc))})
            return self.settings.retry
        active = [{"name": c.name, "uid": c.uid} for c in children
                  if c.state == ChildState.ACTIVE and c not in plan.delete]
        if made.name is not None and made.uid and not any(a["name"] == made.name for a in active):
            active.append({"name": made.name, "uid": made.uid})
        await self._status(view, generation, _conditions(spec, plan), record=record, plan=plan, active=active)
        return self._delay(plan, now)

    def _delay(self, plan: TurnPlan, now: dt.datetime) -> float:
        if plan.waiting:
            return self.settings.waiting_poll
        until = (plan.next - now).total_seconds() if plan.next is not None else self.settings.poll
        return max(0.05, min(until + 0.01, self.settings.poll))

    async def _status(self, view: ScheduleView, generation: int | None, states: Mapping[str, State], *,
                      record: ScheduleRecord | None = None, plan: TurnPlan | None = None,
                      active: list[dict[str, str]] | None = None) -> None:
        changes: dict[str, Any] = {"observedGeneration": generation}
        if record is not None:
            changes.update(record.data())
        if plan is not None:
            changes["nextScheduleTime"] = iso(plan.next)
        if active is not None:
            changes["active"] = active
        changes["conditions"] = merge(view.status.get("conditions") or [], states, generation,
                                      list(SCHEDULE_CONDITIONS))
        if all(view.status.get(k) == v for k, v in changes.items()):
            return
        with contextlib.suppress(Exception):  # a status that could not be written is written next turn
            await self.objects.patch_status(SCHEDULES, view.namespace, view.name, changes)
            view.status.update(changes)


def spec_problem(exc: Exception) -> str:
    """What is wrong with a schedule's spec, where: ``spec.<field>: <why>`` for each problem."""
    if not isinstance(exc, ValidationError):
        return f"metadata.name: {exc}"
    out = []
    for error in exc.errors():
        where = ".".join(str(p) for p in ("spec", *error["loc"]))
        out.append(f"{where}: {str(error['msg']).removeprefix('Value error, ')}")
    return "; ".join(out)


def _conditions(spec: WorkflowScheduleSpec, plan: TurnPlan) -> dict[str, State]:
    when = f"; next tick {iso(plan.next)}" if plan.next is not None and not spec.suspend else ""
    ready: State = (True, "Waiting", plan.waiting) if plan.waiting else (True, "Scheduled", f"schedule valid{when}")
    suspended: State = (spec.suspend, "Suspended" if spec.suspend else "Running",
                        "spec.suspend is true: ticks are passed over" if spec.suspend else "ticks run")
    return {"Ready": ready, "Suspended": suspended}
