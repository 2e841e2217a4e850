"""The operator's own record of each WorkflowSchedule: the last tick it made (or judged missed) and the missed
count. Status shows them, but anyone granted ``workflowschedules/status`` could write status: a forged
``lastScheduleTime`` must not skip or repeat a tick. So, as for Sandboxes (``kube/journal/sandbox_records.py``),
what a turn acts on is kept in a ``Journal`` object of its own, ``dsbsched.<uid>.state`` (part ``schedule``,
owned by the schedule), which no namespace role grants, every value sealed under the journal key: the last tick,
the missed count, and the name and uid of every Workflow the schedule made that still exists (the only ones it
ever deletes: history limits, Replace)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.kube.api.client import ApiException, KubeClient, is_conflict, is_not_found
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.api.resources import API_VERSION, OPERATOR_FIELD_MANAGER
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, MANAGED_BY, JournalObjects
from durable_sandbox.kube.journal.namespaced import NamespacedJournals
from durable_sandbox.kube.journal.sealing import Sealer

__all__ = ["SCHEDULE_LABEL", "ScheduleRecord", "ScheduleRecords"]

SCHEDULE_LABEL = "durable-sandbox.dev/schedule"


@dataclass
class ScheduleRecord:
    last_schedule_time: str | None = None  # RFC 3339
    last_scheduled_workflow: str | None = None
    missed_ticks: int = 0
    recent_missed_ticks: list[str] = field(default_factory=list)
    made: dict[str, str] = field(default_factory=dict)  # Workflow name -> uid: what the operator made, still there

    def data(self) -> dict[str, Any]:
        """What status shows (``made`` is the operator's alone: see :meth:`stored`)."""
        return {"lastScheduleTime": self.last_schedule_time, "lastScheduledWorkflow": self.last_scheduled_workflow,
                "missedTicks": self.missed_ticks, "recentMissedTicks": self.recent_missed_ticks}

    def stored(self) -> dict[str, Any]:
        return {**self.data(), "made": self.made}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ScheduleRecord:
        recent = data.get("recentMissedTicks")
        return cls(last_schedule_time=data.get("lastScheduleTime"),
                   last_scheduled_workflow=data.get("lastScheduledWorkflow"),
                   missed_ticks=int(data.get("missedTicks") or 0),
                   recent_missed_ticks=[str(t) for t in recent] if isinstance(recent, list) else [],
                   made={str(k): str(v) for k, v in made.items()} if isinstance(made := data.get("made"), dict) else {})


class ScheduleRecords:
    """The records of every schedule this operator serves (one ``JournalObjects`` per namespace)."""

    def __init__(self, api: KubeClient, journal_key: bytes | None) -> None:
        self.api = api
        self._journals = NamespacedJournals(api, journal_key, OPERATOR_FIELD_MANAGER)

    def _of(self, namespace: str) -> tuple[JournalObjects, Sealer]:
        return self._journals.of(namespace)

    @staticmethod
    def name(uid: str) -> str:
        return f"dsbsched.{uid}.state"

    async def read(self, namespace: str, uid: str) -> ScheduleRecord:
        """The record (empty before the first tick); :class:`JournalDamaged` when a value fails its seal."""
        objects, sealer = self._of(namespace)
        name = self.name(uid)
        body = await objects.get(name)
        out: dict[str, Any] = {}
        for key, stored in ((body or {}).get("data") or {}).items():
            text = sealer.open(name, key, str(stored), run_id="", where=f"Journal {namespace}/{name}")
            try:
                out[key] = json.loads(text)
            except ValueError as exc:
                raise JournalDamaged("", f"Journal {namespace}/{name} key {key!r}", f"not JSON ({exc})",
                                     tampered=False) from None
        return ScheduleRecord.of(out)

    async def write(self, namespace: str, schedule: str, uid: str, record: ScheduleRecord) -> None:
        objects, sealer = self._of(namespace)
        name = self.name(uid)
        sealed = {key: sealer.seal(name, key, json.dumps(value, separators=(",", ":"), sort_keys=True))
                  for key, value in record.stored().items()}
        ops = [{"op": "add", "path": f"/data/{key}", "value": value} for key, value in sealed.items()]
        try:
            await objects.patch(name, ops)
            return
        except ApiException as exc:
            if not is_not_found(exc):
                raise
        meta = {"name": name, "labels": {**MANAGED_BY, LABEL_PART: "schedule", SCHEDULE_LABEL: label_value(schedule)},
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": "WorkflowSchedule", "name": schedule,
                                     "uid": uid}]}
        try:
            await objects.create(JournalObjects.body(meta, sealed, run=schedule, part="schedule"))
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            await objects.patch(name, ops)
