"""`dsb schedule` on the local store (cli/schedule_book.py): add, list, run-due at chosen times, a tick never made
twice (across two turns, and when the process is killed between creating a tick's run and recording it), missed
ticks said, Forbid waiting for a running run, the worker executing what a schedule made."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tests.docs_commands import DOCS_SCHEDULE_COMMANDS
from tests.dsb import ROOT, dsb

FLOW = "tests.unit.cli_flows:doubler"


def add(store: Path, home: Path, *args: str) -> None:
    ran = dsb("schedule", "add", *args, store=store, home=home)
    assert ran.exit_code == 0, ran.output


def due(store: Path, home: Path, at: str, **kw: object) -> list[dict[str, object]]:
    ran = dsb("-o", "json", "schedule", "run-due", "--at", at, store=store, home=home, **kw)  # type: ignore[arg-type]
    assert ran.exit_code == 0, ran.output
    out: list[dict[str, object]] = json.loads(ran.stdout)
    return out


def runs(store: Path, home: Path) -> list[str]:
    ran = dsb("-o", "json", "runs", store=store, home=home)
    return sorted(r["runId"] for r in json.loads(ran.stdout))


def book(store: Path) -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(Path(f"{store}.schedules.json").read_text())
    return data


def test_each_due_tick_is_one_run_and_missed_ticks_are_said(tmp_path: Path) -> None:
    store, home = tmp_path / "runs.db", tmp_path / "home"
    add(store, home, "double", FLOW, "--every", "60s", "--input", '{"x": 4}')
    first = due(store, home, "2099-01-01T10:00:30Z")
    assert first[0]["created"] == "double-4070944800" and first[0]["missed"] != [], "created long ago: ticks missed"
    assert due(store, home, "2099-01-01T10:00:40Z")[0]["created"] is None, "the same tick: nothing new"
    assert due(store, home, "2099-01-01T10:01:05Z")[0]["created"] == "double-4070944860"
    later = due(store, home, "2099-01-01T10:04:10Z")[0]
    assert later["created"] == "double-4070945040"
    assert later["missed"] == ["2099-01-01T10:02:00Z", "2099-01-01T10:03:00Z"]
    assert runs(store, home) == ["double-4070944800", "double-4070944860", "double-4070945040"]
    listed = dsb("schedule", "list", store=store, home=home)
    assert "double" in listed.stdout and "every 60s" in listed.stdout
    # A worker executes what the schedule made.
    worked = dsb("worker", "--until-idle", store=store, home=home)
    assert worked.exit_code == 0, worked.output
    state = json.loads(dsb("-o", "json", "inspect", "double-4070945040", store=store, home=home).stdout)
    assert state["status"] == "succeeded" and state["result"] == {"doubled": 8}


def test_killed_between_creating_the_run_and_recording_it_the_tick_is_recorded_not_made_again(tmp_path: Path) -> None:
    store, home = tmp_path / "runs.db", tmp_path / "home"
    add(store, home, "double", FLOW, "--every", "60s", "--concurrency-policy", "Forbid")
    killed = dsb("schedule", "run-due", "--at", "2099-01-01T10:00:30Z", store=store, home=home,
                 fault="schedule.created", cwd=ROOT)
    assert killed.exit_code == -9, killed.output
    assert runs(store, home) == ["double-4070944800"]
    assert book(store)["double"]["last_schedule_time"] is None, "the book was not written"
    again = due(store, home, "2099-01-01T10:00:50Z", cwd=ROOT)
    assert again[0]["created"] is None and again[0]["recorded"] == "double-4070944800"
    assert runs(store, home) == ["double-4070944800"]
    assert book(store)["double"]["last_schedule_time"] == "2099-01-01T10:00:00Z"
    # Forbid: the next tick waits while that run has not run yet (no worker executed it).
    waiting = due(store, home, "2099-01-01T10:01:05Z", cwd=ROOT)[0]
    assert waiting["created"] is None and "Forbid" in str(waiting["waiting"])


def test_refusals_say_what_is_wrong(tmp_path: Path) -> None:
    store, home = tmp_path / "runs.db", tmp_path / "home"
    bad = dsb("schedule", "add", "s", FLOW, "--cron", "* * *", store=store, home=home)
    assert bad.exit_code == 2 and "has 3 fields; it needs 5" in bad.output, bad.output
    both = dsb("schedule", "add", "s", FLOW, "--cron", "* * * * *", "--every", "5m", store=store, home=home)
    assert both.exit_code == 2 and "exactly one" in both.output, both.output
    add(store, home, "s", FLOW, "--every", "5m")
    dup = dsb("schedule", "add", "s", FLOW, "--every", "5m", store=store, home=home)
    assert dup.exit_code == 2 and "exists already" in dup.output
    assert dsb("schedule", "remove", "s", store=store, home=home).exit_code == 0
    assert dsb("schedule", "remove", "s", store=store, home=home).exit_code == 2


def test_the_docs_schedule_commands_work(tmp_path: Path) -> None:
    """docs/workflows.md, "Schedules": the commands as written, then the turn a `dsb worker --schedules` poll takes."""
    store, home = tmp_path / "runs.db", tmp_path / "home"
    for text in DOCS_SCHEDULE_COMMANDS:
        argv = shlex.split(text)
        assert argv[0] == "dsb"
        ran = dsb(*argv[1:], store=store, home=home, cwd=ROOT)
        assert ran.exit_code == 0, f"{text}: {ran.output}"
    listed = dsb("schedule", "list", store=store, home=home).stdout
    assert "nightly" in listed and "30 2 * * * (Europe/Berlin)" in listed and "every 60s" in listed
    ticked = {t["schedule"]: t for t in due(store, home, "2099-07-01T00:35:00Z", cwd=ROOT)}
    assert ticked["nightly"]["created"] == "nightly-4086549000", "02:30 in Berlin (summer) is 00:30 UTC"
    assert ticked["every-minute"]["created"] == "every-minute-4086549300"


def test_with_kube_it_says_where_schedules_live_in_a_cluster(tmp_path: Path) -> None:
    for args in (("schedule", "list"), ("schedule", "run-due"), ("schedule", "add", "s", FLOW, "--every", "5m")):
        ran = dsb("--kube", *args, home=tmp_path)
        assert ran.exit_code == 2 and "apply a WorkflowSchedule" in ran.output, ran.output
