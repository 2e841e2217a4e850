"""The commands Argo, Temporal and kubectl users expect: `run --detach` + `wait`, `delete`, `prune`,
`run --dry-run`, a finished manifest reported rather than re-run, `worker --until-idle` saying what it
ran, and a `--store` that does not exist being an error."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine import RunRecord, RunStatus
from durable_sandbox.stores import SqliteStore
from tests.dsb import ROOT, dsb, lines

FLOWS = "tests.unit.cli_flows"
EXAMPLE = ROOT / "examples" / "hello-workflow.yaml"



def as_json(text: str) -> Any:
    return json.loads(text)


def run_ids() -> list[str]:
    return sorted(r["runId"] for r in as_json(dsb("-o", "json", "runs").stdout))


def local_leftovers(home: Path) -> list[str]:
    """Sandboxes (workspaces) and snapshots the local provider still keeps."""
    root = home / "local"
    return sorted(p.name for sub in ("workspaces", "snapshots") if (root / sub).is_dir() for p in (root / sub).iterdir())


def store_call(home: Path, fn: Any) -> Any:
    async def go() -> Any:
        store = SqliteStore(home / "runs.db")
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(go())


# ------------------------------------------------------------------ run --detach, wait


@pytest.mark.parametrize(
    ("flow", "data", "code", "line"),
    [
        ("doubler", '{"x": 4}', 0, "run {rid} succeeded"),
        ("boom", "null", 1, "run {rid} failed: StepFailed: "),
        ("approval", "{}", 3, "run {rid} is waiting"),
    ],
)
def test_detach_then_wait_exits_with_the_runs_code(flow: str, data: str, code: int, line: str) -> None:
    rid = f"detached-{flow}"
    started = dsb("run", "--detach", f"{FLOWS}:{flow}", "--input", data, "--run-id", rid)
    assert started.exit_code == 0, started.output
    assert lines(started.stdout)[0] == f"run {rid} ({FLOWS}:{flow}) started in the background"
    waited = dsb("wait", rid)
    assert waited.exit_code == code, waited.output
    assert any(out.startswith(line.format(rid=rid)) for out in lines(waited.stdout)), waited.stdout
    if code == 0:
        assert '"doubled": 8' in waited.stdout


def test_detach_json_and_generated_run_id() -> None:
    started = dsb("-o", "json", "run", "--detach", f"{FLOWS}:doubler", "--input", '{"x": 1}')
    assert started.exit_code == 0, started.output
    doc = as_json(started.stdout)
    assert doc["runId"].startswith("run-") and doc["workflow"] == f"{FLOWS}:doubler"
    waited = dsb("-o", "json", "wait", doc["runId"])
    assert waited.exit_code == 0 and as_json(waited.stdout)["result"] == {"doubled": 2}
    assert run_ids() == [doc["runId"]]  # the background process continued this run, not a new one


def test_detach_refuses_stdin_and_dry_run_together() -> None:
    assert dsb("run", "--detach", "-", input="kind: Workflow").stderr.startswith("error: --detach needs a manifest file")
    both = dsb("run", "--detach", "--dry-run", str(EXAMPLE))
    assert both.exit_code == 2 and "give --detach or --dry-run, not both" in both.stderr


def test_wait_timeout_and_an_orphaned_run(home: Path) -> None:
    async def make(store: SqliteStore) -> None:
        await store.create_run(RunRecord(run_id="nobody", workflow=f"{FLOWS}:doubler", input=None))
        await store.create_run(
            RunRecord(run_id="orphan", workflow=f"{FLOWS}:doubler", input=None, status=RunStatus.RUNNING))
        # Its worker died: the lease it held has expired.
        await store.update_run("orphan", {"lease_owner": "dead-worker", "lease_expires_at": time.time() - 60})

    dsb("runs")  # creates the default store
    store_call(home, make)
    gave_up = dsb("wait", "nobody", "--timeout", "0.3s")  # pending, and no worker serves this store
    assert gave_up.exit_code == 5
    assert gave_up.stderr.startswith("error: run nobody is still pending after 0.3s")
    orphan = dsb("wait", "orphan")
    assert orphan.exit_code == 3 and "run orphan is running" in orphan.stdout
    assert "continue with: dsb resume orphan" in orphan.stderr
    assert dsb("wait", "nobody", "--timeout", "soon").exit_code == 2


# ------------------------------------------------------------------ delete, prune


def test_delete_finished_runs_and_refuse_unfinished_ones(home: Path) -> None:
    assert dsb("run", f"{FLOWS}:doubler", "--run-id", "done").exit_code == 0
    assert dsb("run", f"{FLOWS}:held", "--input", "{}", "--run-id", "holding").exit_code == 3
    assert local_leftovers(home)  # the waiting run keeps its sandbox's snapshot
    refused = dsb("delete", "holding")
    assert refused.exit_code == 2
    assert lines(refused.stderr) == [
        "error: Run 'holding' is waiting; cancel it first (`dsb cancel holding`), or delete it with --force, "
        "which cancels it (cleaning up its sandboxes) and then deletes it."
    ]
    deleted = dsb("delete", "done")
    assert deleted.exit_code == 0 and lines(deleted.stdout) == ["run done deleted"]
    assert run_ids() == ["holding"]
    assert dsb("inspect", "done").exit_code == 2 and dsb("delete", "done").exit_code == 2
    forced = dsb("-o", "json", "delete", "--force", "holding")
    assert forced.exit_code == 0 and as_json(forced.stdout) == {"deleted": ["holding"]}
    assert run_ids() == [] and local_leftovers(home) == []  # cancelled, cleaned up, then deleted


def test_delete_finalizes_a_sandbox_a_finished_runs_journal_still_holds(home: Path) -> None:
    assert dsb("run", f"{FLOWS}:held", "--input", "{}", "--run-id", "stuck").exit_code == 3
    # As if its cleanup had failed when it ended: finished, yet its journal shows the session open.
    store_call(home, lambda s: s.update_run("stuck", {"status": RunStatus.FAILED}))
    assert local_leftovers(home)
    assert dsb("delete", "stuck").exit_code == 0
    assert run_ids() == [] and local_leftovers(home) == []


def test_prune_deletes_finished_runs_older_than_the_duration(home: Path) -> None:
    for rid in ("old-ok", "new-ok"):
        assert dsb("run", f"{FLOWS}:doubler", "--run-id", rid).exit_code == 0
    assert dsb("run", f"{FLOWS}:boom", "--run-id", "old-bad").exit_code == 1
    assert dsb("run", f"{FLOWS}:approval", "--input", "{}", "--run-id", "old-waiting").exit_code == 3
    with sqlite3.connect(home / "runs.db") as db:  # age three of them by two days
        db.execute("UPDATE runs SET updated_at = updated_at - 172800 WHERE run_id LIKE 'old-%'")
    pruned = dsb("prune", "--older-than", "1d")
    assert pruned.exit_code == 0, pruned.output
    assert lines(pruned.stdout) == ["deleted 2 run(s) finished more than 1d ago: old-ok, old-bad"] or lines(
        pruned.stdout) == ["deleted 2 run(s) finished more than 1d ago: old-bad, old-ok"]
    assert run_ids() == ["new-ok", "old-waiting"]  # recent, and unfinished, runs stay
    again = dsb("-o", "json", "prune", "--older-than", "1d")
    assert as_json(again.stdout) == {"deleted": [], "kept": {}}
    bad = dsb("prune", "--older-than", "7 days")
    assert bad.exit_code == 2 and "is not a duration" in bad.stderr


# ------------------------------------------------------------------ dry run, finished manifests


def test_dry_run_validates_prints_the_plan_and_creates_nothing(home: Path) -> None:
    result = dsb("run", "--dry-run", str(EXAMPLE))
    assert result.exit_code == 0, result.output
    out = lines(result.stdout)
    assert out[0].startswith("Workflow/hello: run hello-") and out[0].endswith("of workflow sandbox-agent (new run)")
    assert out[1:5] == ["  1. write_file: notes/hello.txt", '  2. shell: echo "$GREETING, $(wc -l < note…',
                        "  3. read_file: notes/hello.txt", "  4. shell: ls does-not-exist"]
    assert out[-1] == "dry run: nothing was created or run"
    assert not (home / "runs.db").exists()
    doc = as_json(dsb("-o", "json", "run", "--dry-run", f"{FLOWS}:doubler", "--input", '{"x": 1}').stdout)
    assert doc["workflow"] == f"{FLOWS}:doubler" and doc["input"] == {"x": 1} and doc["existingStatus"] is None
    bad = dsb("run", "--dry-run", f"{FLOWS}:greet", "--input", "{}")
    assert bad.exit_code == 2 and "input.name: Field required" in bad.stderr  # validated as for a real run
    assert dsb("run", str(EXAMPLE)).exit_code == 0
    assert "(exists, succeeded: would report it, run nothing)" in dsb("run", "--dry-run", str(EXAMPLE)).stdout


def test_rerunning_a_finished_manifest_reports_it_and_runs_nothing() -> None:
    first = as_json(dsb("-o", "json", "run", str(EXAMPLE)).stdout)
    journal = len(as_json(dsb("-o", "json", "history", first["runId"]).stdout))
    again = dsb("run", str(EXAMPLE))
    assert again.exit_code == 0
    out = lines(again.stdout)
    assert out[0].startswith(f"run {first['runId']} (Workflow/hello) already succeeded at ")
    assert out[0].endswith(f"nothing was run again (`dsb delete {first['runId']}` to run it afresh)")
    assert f"run {first['runId']} succeeded" in out and '"exitCode": 2' in again.stdout  # and its result
    assert "call.completed" not in again.stdout
    assert len(as_json(dsb("-o", "json", "history", first["runId"]).stdout)) == journal


# ------------------------------------------------------------------ worker, --store


def test_worker_until_idle_reports_what_it_ran(home: Path) -> None:
    dsb("runs")  # creates the default store

    async def make(store: SqliteStore) -> None:
        await store.create_run(RunRecord(run_id="w-ok", workflow=f"{FLOWS}:doubler", input={"x": 2},
                                         workflow_ref=f"{FLOWS}:doubler"))
        await store.create_run(RunRecord(run_id="w-wait", workflow=f"{FLOWS}:approval", input={},
                                         workflow_ref=f"{FLOWS}:approval"))

    store_call(home, make)
    result = dsb("worker", "--until-idle")
    assert result.exit_code == 0, result.output
    out = lines(result.stdout)
    assert out[0] == "worker executed 2 run(s)"
    assert any("w-ok" in line and "succeeded" in line for line in out)
    assert any("w-wait" in line and "waiting" in line and "approve" in line for line in out)
    idle = dsb("-o", "json", "worker", "--until-idle")
    assert idle.exit_code == 0 and as_json(idle.stdout) == []


def test_a_store_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    for command in (["runs"], ["inspect", "x"], ["logs", "x"], ["delete", "x"], ["wait", "x"], ["worker", "--until-idle"]):
        result = dsb("--store", str(missing), *command)
        assert result.exit_code == 2, (command, result.output)
        assert lines(result.stderr) == [f"error: --store {missing}: no such store file; check the path "
                                        "(`dsb run --store PATH ...` creates one)"]
    assert not missing.exists()
    assert dsb("--store", str(missing), "run", f"{FLOWS}:doubler").exit_code == 0  # run creates it, on purpose
    assert missing.exists() and dsb("--store", str(missing), "runs").exit_code == 0
