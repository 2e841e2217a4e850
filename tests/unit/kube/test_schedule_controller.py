"""The WorkflowSchedule controller's turn (kube/schedule/) on a fake API server: what it makes, records and
deletes, and that nothing a namespace user can write without the schedule's spec (a status, a Workflow's status, a
Workflow under the tick's name, the record) changes what it runs or deletes."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from durable_sandbox.engine import RunRecord, RunStatus
from durable_sandbox.kube.reporting.events import EventRecorder
from durable_sandbox.kube.schedule.children import SEAL_ANNOTATION, schedule_seal
from durable_sandbox.kube.schedule.controller import ScheduleController, ScheduleSettings, ScheduleView
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.schedules import tick_name
from tests.unit.kube.schedule_support import FakeScheduleClient

NS, NAME = "team", "every-minute"
KEY = b"k" * 32
NOW = dt.datetime(2026, 5, 1, 10, 1, 5, tzinfo=dt.UTC)
TICK = dt.datetime(2026, 5, 1, 10, 1, tzinfo=dt.UTC)
TEMPLATE = {"metadata": {"labels": {"team": "reports"}},
            "spec": {"sandbox": {"provider": "local"}, "toolCalls": [{"type": "shell", "command": "true"}]}}


def setup(**spec: Any) -> tuple[FakeScheduleClient, ScheduleController, ScheduleView, dict[str, RunRecord]]:
    api = FakeScheduleClient()
    body = api.custom.plant("workflowschedules", NS, {
        "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "WorkflowSchedule",
        "metadata": {"name": NAME, "generation": 1, "creationTimestamp": "2026-05-01T10:00:30Z"},
        "spec": {"schedule": "* * * * *", "workflowTemplate": TEMPLATE, **spec}})
    runs: dict[str, RunRecord] = {}

    async def run_of(namespace: str, run_id: str) -> RunRecord | None:
        return runs.get(run_id)

    controller = ScheduleController(api, EventRecorder(api.core, instance="test"), run_of, KEY,  # type: ignore[arg-type]
                                    ScheduleSettings(clock=lambda: NOW))
    meta = body["metadata"]
    view = ScheduleView(namespace=NS, name=NAME, uid=meta["uid"], body=body,
                        body_of=lambda: api.custom.objects[("workflowschedules", NS, NAME)])
    return api, controller, view, runs


def plant_child(api: FakeScheduleClient, uid: str, name: str, *, sealed: bool = True, **extra: Any) -> dict[str, Any]:
    """A Workflow owned by the schedule (ownerReferences), as the operator makes it when ``sealed``."""
    annotations = {SEAL_ANNOTATION: schedule_seal(KEY, NS, uid, name)} if sealed else {}
    return api.custom.plant("workflows", NS, {
        "metadata": {"name": name, "labels": {"durable-sandbox.dev/schedule": NAME}, "annotations": annotations,
                     "ownerReferences": [{"kind": "WorkflowSchedule", "uid": uid}]}, **extra})


def workflows(api: FakeScheduleClient) -> dict[str, dict[str, Any]]:
    return {k[2]: o for k, o in api.custom.objects.items() if k[0] == "workflows"}


def status(api: FakeScheduleClient) -> dict[str, Any]:
    st: dict[str, Any] = api.custom.objects[("workflowschedules", NS, NAME)].get("status") or {}
    return st


def reasons(api: FakeScheduleClient) -> list[str]:
    return [e["reason"] for e in api.core.events]


def test_a_due_tick_makes_one_owned_workflow_and_records_it() -> None:
    api, controller, view, _ = setup()
    delay = asyncio.run(controller.turn(view))
    name = tick_name(NAME, TICK)
    made = workflows(api)[name]
    assert made["metadata"]["ownerReferences"][0]["uid"] == view.uid
    assert made["metadata"]["labels"] == {"team": "reports", "durable-sandbox.dev/schedule": NAME}
    assert made["spec"] == TEMPLATE["spec"]
    st = status(api)
    assert st["lastScheduleTime"] == "2026-05-01T10:01:00Z" and st["lastScheduledWorkflow"] == name
    assert st["active"] == [{"name": name, "uid": made["metadata"]["uid"]}]
    assert st["nextScheduleTime"] == "2026-05-01T10:02:00Z"
    assert delay == controller.settings.poll, "the next tick is 55 s away: it looks again after poll seconds"
    assert ("journals", NS, f"dsbsched.{view.uid}.state") in api.custom.objects
    assert reasons(api) == ["Scheduled"]
    asyncio.run(controller.turn(view))
    assert len(workflows(api)) == 1 and api.custom.created.count(("workflows", NS, name)) == 1


def test_a_workflow_made_before_a_crash_is_recorded_not_made_again() -> None:
    api, controller, view, _ = setup()
    name = tick_name(NAME, TICK)
    plant_child(api, view.uid, name)  # made, sealed, and the operator killed before it recorded it
    asyncio.run(controller.turn(view))
    assert api.custom.created == [("journals", NS, f"dsbsched.{view.uid}.state")], "no Workflow made"
    assert status(api)["lastScheduleTime"] == "2026-05-01T10:01:00Z" and status(api)["missedTicks"] == 0


def test_an_ownerreference_and_a_label_do_not_make_a_workflow_the_schedules() -> None:
    api, controller, view, runs = setup(failedRunsHistoryLimit=0)
    name = tick_name(NAME, TICK)
    plant_child(api, view.uid, name, sealed=False)  # a namespace user's, claiming the schedule as its owner
    asyncio.run(controller.turn(view))
    assert "TickNameTaken" in reasons(api) and status(api)["missedTicks"] == 1
    assert status(api)["active"] == [] and api.custom.deleted == []
    copied = plant_child(api, view.uid, tick_name(NAME, TICK - dt.timedelta(minutes=5)))
    run_id = cluster_run_id(copied["metadata"]["name"], copied["metadata"]["uid"])
    runs[run_id] = RunRecord(run_id=run_id, workflow="sandbox-agent", status=RunStatus.FAILED)
    asyncio.run(controller.turn(view))  # a seal copied onto a Workflow of a tick already recorded: never the schedule's
    assert api.custom.deleted == [], "a failed Workflow of its own would have gone (failedRunsHistoryLimit: 0)"


def test_a_forged_status_neither_skips_nor_repeats_a_tick() -> None:
    api, controller, view, _ = setup()
    api.custom.objects[("workflowschedules", NS, NAME)]["status"] = {"lastScheduleTime": "2030-01-01T00:00:00Z"}
    asyncio.run(controller.turn(view))
    assert tick_name(NAME, TICK) in workflows(api), "the record, not status, says what ran"


def test_a_workflow_under_the_ticks_name_that_is_not_the_schedules_is_never_adopted() -> None:
    api, controller, view, _ = setup()
    name = tick_name(NAME, TICK)
    api.custom.plant("workflows", NS, {"metadata": {"name": name, "labels": {"durable-sandbox.dev/schedule": NAME}}})
    asyncio.run(controller.turn(view))
    assert "TickNameTaken" in reasons(api) and "MissedTicks" in reasons(api)
    st = status(api)
    assert st["missedTicks"] == 1 and st["recentMissedTicks"] == ["2026-05-01T10:01:00Z"] and st["active"] == []


def test_history_goes_by_the_runs_journal_record_not_the_workflows_status() -> None:
    api, controller, view, runs = setup(successfulRunsHistoryLimit=0, concurrencyPolicy="Forbid")
    old = tick_name(NAME, TICK - dt.timedelta(minutes=1))
    body = plant_child(api, view.uid, old, status={"phase": "Succeeded", "runId": "elsewhere"})  # forged: it runs
    run_id = cluster_run_id(old, body["metadata"]["uid"])
    runs[run_id] = RunRecord(run_id=run_id, workflow="sandbox-agent", status=RunStatus.RUNNING)
    asyncio.run(controller.turn(view))
    assert old in workflows(api) and api.custom.deleted == [], "a running Workflow is not pruned"
    assert tick_name(NAME, TICK) not in workflows(api), "Forbid: the tick waits for the running one"
    assert {c["type"]: c["reason"] for c in status(api)["conditions"]}["Ready"] == "Waiting"
    runs[run_id] = RunRecord(run_id=run_id, workflow="sandbox-agent", status=RunStatus.SUCCEEDED)
    asyncio.run(controller.turn(view))
    assert old not in workflows(api) and tick_name(NAME, TICK) in workflows(api)


def test_a_tampered_record_stops_the_schedule_saying_so() -> None:
    api, controller, view, _ = setup()
    asyncio.run(controller.turn(view))
    record = api.custom.objects[("journals", NS, f"dsbsched.{view.uid}.state")]
    record["data"]["lastScheduleTime"] = '"2030-01-01T00:00:00Z"'  # no seal: an edit
    before = set(workflows(api))
    asyncio.run(controller.turn(view))
    ready = {c["type"]: c for c in status(api)["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "RecordDamaged" and set(workflows(api)) == before


def test_an_invalid_spec_is_said_in_ready() -> None:
    api, controller, view, _ = setup(timeZone="Mars/Olympus")
    asyncio.run(controller.turn(view))
    ready = {c["type"]: c for c in status(api)["conditions"]}["Ready"]
    assert ready["reason"] == "InvalidSpec" and "not an IANA time zone" in ready["message"] and not workflows(api)
