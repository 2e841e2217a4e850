"""The small display slips a new user met (issue 33, item 5), each as behaviour: counts in words ("1 call"),
a recovery told once in `dsb logs`, a recovered run's result naming its replacement sandbox, `-o json logs`
saying which counter each object's seq is, and the detach log as private as the store beside it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import yaml

from durable_sandbox.engine.records import Event, OperationRecord
from durable_sandbox.ui.timeline import Timeline
from tests.dsb import ROOT, dsb, lines

EXAMPLE = ROOT / "examples" / "hello-workflow.yaml"


def lossy_manifest(tmp_path: Path) -> Path:
    """The README's example, its sandbox lost after 3 calls (a snapshot after 2): one recovery."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["injectLossAfterNCalls"] = 3
    path = tmp_path / "lossy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_recovery_is_told_once_and_the_result_names_the_replacement_sandbox(tmp_path: Path) -> None:
    ran = dsb("-o", "json", "run", str(lossy_manifest(tmp_path)), "--run-id", "lossy")
    assert ran.exit_code == 0, ran.output
    result = json.loads(ran.stdout)["result"]
    events = [json.loads(line) for line in dsb("-o", "json", "logs", "lossy").stdout.splitlines()]
    [lost] = [e for e in events if e["type"] == "sandbox.destroyed" and e["opId"].startswith("sandbox/destroy/")
              and e["journalSeq"] < next(x["journalSeq"] for x in events if x["type"] == "sandbox.recovered")]
    [made] = [e for e in events if e["type"] == "sandbox.restore.provisioned"]
    assert result["recoveryCount"] == 1 and result["sandboxId"] == made["sandboxId"]
    assert lost["opId"] != f"sandbox/destroy/{result['sandboxId']}", "the result names the lost sandbox"
    shown = lines(dsb("logs", "--call-output", "lossy").stdout)
    types = [line.split()[1] for line in shown if line[:2].isdigit()]
    assert types.count("sandbox.restore.started") == 1 and types.count("sandbox.restore.provisioned") == 1, shown


def test_json_logs_say_which_counter_each_seq_is(tmp_path: Path) -> None:
    assert dsb("run", str(EXAMPLE), "--run-id", "counted").exit_code == 0
    events = [json.loads(line) for line in dsb("-o", "json", "logs", "counted").stdout.splitlines()]
    assert not [e for e in events if "seq" in e]
    journal = [e["journalSeq"] for e in events if "opId" in e]
    run_events = [e["eventSeq"] for e in events if "opId" not in e]
    assert journal and run_events and all("journalSeq" not in e for e in events if "opId" not in e)
    history = json.loads(dsb("-o", "json", "history", "counted").stdout)
    assert journal == [r["seq"] for r in history], "journalSeq is the record's seq in `dsb history`"
    assert run_events == sorted(set(run_events))


def test_one_call_is_one_call() -> None:
    tl = Timeline(0.0)
    tl.feed([OperationRecord("ws/snapshot/1", "sandbox.snapshot", "snapshot", "completed", meta={"count": 1},
                             result={"snapshotId": "s1"}, ts=1.0, seq=1),
             OperationRecord("ws/inject_loss/1", "sandbox.inject_loss", "inject_loss", "completed", meta={"count": 1},
                             ts=2.0, seq=2)],
            [Event("r", "sandbox.hibernated", {"session": "ws", "count": 1}, ts=3.0, seq=1)])
    labels = sorted(i.label for i in tl.items.values())
    assert labels == ["sandbox hibernated (ws) after 1 call", "sandbox lost (injected after 1 call)",
                      "snapshot after 1 call"]
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["toolCalls"] = doc["spec"]["toolCalls"][:1]
    ran = dsb("run", "-", "--run-id", "one", input=yaml.safe_dump(doc))
    assert ran.exit_code == 0, ran.output
    assert "1 call done (100%)" in ran.stdout and "1 calls" not in ran.stdout


def test_the_detach_log_is_owner_only_like_the_store(home: Path) -> None:
    log = home / "runs.db.detached.log"
    log.write_text("from an older version\n")
    log.chmod(0o644)
    started = dsb("run", "--detach", "tests.unit.cli_flows:doubler", "--input", '{"x": 1}', "--run-id", "bg")
    assert started.exit_code == 0, started.output
    assert dsb("wait", "bg").exit_code == 0
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert log.read_text().startswith("from an older version")


def test_the_docs_run_transcript_shows_the_op_ids_dsb_prints() -> None:
    """docs/cli.md's `dsb run examples/hello-workflow.yaml` transcript: its run id and call op ids are derived
    (a hash of the manifest; of the run id, session and index), so they are what `dsb run` prints today."""
    doc = (ROOT / "docs" / "cli.md").read_text().splitlines()
    start = doc.index("$ dsb run examples/hello-workflow.yaml") + 1
    documented = doc[start : doc.index("```", start)]
    ran = dsb("run", str(EXAMPLE.relative_to(ROOT)))
    assert ran.exit_code == 0, ran.output

    def ids(text: list[str]) -> list[str]:
        return [line.split("[", 1)[1].split("]", 1)[0] for line in text if "call.completed" in line]

    assert len(ids(documented)) == 4 and ids(documented) == ids(lines(ran.stdout))
    assert documented[0] == lines(ran.stdout)[0]  # run <id> (Workflow/hello)
