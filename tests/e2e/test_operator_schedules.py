"""WorkflowSchedules on a real API server with the real operator (issue 38, item 4): a tick is never doubled, even
when the operator is killed between making a tick's Workflow and recording it (the ``schedule.created`` fault point),
and ticks missed while no operator ran are recorded (status.missedTicks and a Warning Event), only the newest run."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import ROOT, events, namespace, operators, status

__all__ = ["namespace", "operators"]  # fixtures

EXAMPLE = ROOT / "examples" / "nightly-schedule.yaml"
SCHEDULE_LABEL = "durable-sandbox.dev/schedule"


def schedule_manifest(name: str, every: str, **spec: Any) -> dict[str, Any]:
    """The example, ticking every ``every`` instead of nightly (a test cannot wait for 02:30 in Berlin)."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    for key in ("schedule", "timeZone"):
        doc["spec"].pop(key)
    doc["spec"].update(every=every, **spec)
    return doc


def apply(cp: ControlPlane, ns: str, doc: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    cp.kubectl("apply", "-n", ns, "-f", str(path))
    got: dict[str, Any] = cp.kubectl_json("get", "workflowschedule", doc["metadata"]["name"], "-n", ns)
    return got


def schedule(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = cp.kubectl_json("get", "dwfsched", name, "-n", ns)
    return got


def made(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.kubectl_json("get", "workflows", "-n", ns, "-l", f"{SCHEDULE_LABEL}={name}")["items"]
    return sorted(items, key=lambda w: w["metadata"]["name"])


def tick_of(workflow: dict[str, Any], schedule_name: str) -> dt.datetime:
    seconds = int(workflow["metadata"]["name"].removeprefix(f"{schedule_name}-"))
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def iso(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_killed_between_making_a_tick_and_recording_it_the_tick_is_not_made_twice(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    cp, ns, name = control_plane, namespace, "every-20s"
    first = operators("--allow-local-provider", fault="schedule.created")
    sched = apply(cp, ns, schedule_manifest(name, "20s"), tmp_path)
    uid = sched["metadata"]["uid"]
    wait_until(lambda: not first.alive(), 90, "the operator to be killed at schedule.created")
    [workflow] = made(cp, ns, name)
    tick = tick_of(workflow, name)
    assert [r["uid"] for r in workflow["metadata"]["ownerReferences"]] == [uid]
    assert workflow["metadata"]["labels"]["team"] == "reports", "the template's labels"
    assert workflow["metadata"]["annotations"]["durable-sandbox.dev/scheduled-at"] == iso(tick)
    assert not schedule(cp, ns, name).get("status", {}).get("lastScheduleTime"), "killed before the record"
    state = cp.kubectl("get", "journals", f"dsbsched.{uid}.state", "-n", ns, check=False)
    assert state.returncode != 0, "the record was never written"

    operators("--allow-local-provider", name="operator-2")
    wait_until(lambda: (schedule(cp, ns, name).get("status") or {}).get("lastScheduleTime", "") >= iso(tick), 90,
               "the restarted operator to record the tick")
    st = schedule(cp, ns, name)["status"]
    assert iso(tick) not in st.get("recentMissedTicks", []), "the tick made before the crash is not missed"
    again = {w["metadata"]["name"]: w["metadata"]["uid"] for w in made(cp, ns, name)}
    assert again[workflow["metadata"]["name"]] == workflow["metadata"]["uid"], "not deleted and made again"
    assert len(again) == len(set(again.values())) and all(tick_of({"metadata": {"name": n}}, name) >= tick for n in again)
    scheduled = [e["message"] for e in events(cp, ns, name) if e["reason"] == "Scheduled"]
    assert sum(workflow["metadata"]["name"] in m for m in scheduled) == 1, scheduled
    # The tick's Workflow runs (the operator executes it as any Workflow).
    wait_until(lambda: status(cp, ns, workflow["metadata"]["name"]).get("phase") == "Succeeded", 120,
               f"Workflow {workflow['metadata']['name']} to succeed")
    assert cp.kubectl("get", "journals", f"dsbsched.{uid}.state", "-n", ns, check=False).returncode == 0
    table = cp.kubectl("get", "dwfsched", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "SCHEDULE", "EVERY", "SUSPEND", "ACTIVE", "LAST", "NEXT", "AGE"], table


def test_ticks_missed_while_no_operator_ran_are_recorded_and_only_the_newest_runs(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    cp, ns, name = control_plane, namespace, "every-3s"
    sched = apply(cp, ns, schedule_manifest(name, "3s", successfulRunsHistoryLimit=1), tmp_path)
    created = dt.datetime.fromisoformat(sched["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    # No operator runs while at least three ticks pass.
    wait_until(lambda: dt.datetime.now(dt.UTC) >= created + dt.timedelta(seconds=10), 30, "three ticks to pass")
    assert made(cp, ns, name) == []
    operators("--allow-local-provider")
    wait_until(lambda: (schedule(cp, ns, name).get("status") or {}).get("missedTicks", 0) >= 2, 90,
               "the missed ticks to be recorded")
    st = schedule(cp, ns, name)["status"]
    first = made(cp, ns, name)[0]
    assert tick_of(first, name) > created + dt.timedelta(seconds=9), "the first Workflow is of the newest tick"
    assert all(t < iso(tick_of(first, name)) for t in st["recentMissedTicks"]), st
    warnings = [e for e in events(cp, ns, name) if e["reason"] == "MissedTicks"]
    assert warnings and warnings[0]["type"] == "Warning" and "not run" in warnings[0]["message"]
    # History: at most one succeeded Workflow is kept (successfulRunsHistoryLimit: 1) once several have run.
    cp.kubectl("patch", "dwfsched", name, "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"suspend": True}}))
    wait_until(lambda: all(status(cp, ns, w["metadata"]["name"]).get("phase") in ("Succeeded", "Failed")
                           for w in made(cp, ns, name)) and len(made(cp, ns, name)) <= 1, 120,
               "the finished Workflows beyond the history limit to be deleted")
    conditions = {c["type"]: c for c in schedule(cp, ns, name)["status"]["conditions"]}
    assert conditions["Suspended"]["status"] == "True" and conditions["Ready"]["status"] == "True"


@pytest.mark.parametrize(("spec", "says"), [
    ({"every": "5m", "schedule": "* * * * *"}, "set exactly one of schedule (cron) or every"),
    ({"every": "5m", "timeZone": "UTC"}, "timeZone applies to a cron schedule, not to every"),
])
def test_admission_refuses_a_bad_schedule(control_plane: ControlPlane, namespace: str, tmp_path: Path,
                                          spec: dict[str, Any], says: str) -> None:
    doc = schedule_manifest("bad", "5m")
    doc["spec"].pop("every")
    doc["spec"].update(spec)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = control_plane.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr
    long = schedule_manifest("x" * 53, "5m")
    path.write_text(yaml.safe_dump(long))
    proc = control_plane.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
    assert proc.returncode != 0 and "at most 52 characters" in proc.stderr, proc.stderr
