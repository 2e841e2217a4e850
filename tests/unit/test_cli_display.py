"""What `dsb` shows while and after a run: calls by type and an excerpt of their command or path, short
ids (full with -o wide and in JSON), the call in flight on the progress line, ellipses where text is cut,
the manifest's Workflow name, calls' stdout/stderr in `dsb logs`, RFC 3339 times in JSON."""

from __future__ import annotations

import io
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.cli import render
from durable_sandbox.cli.progress import RichDisplay
from tests.dsb import ROOT, dsb

EXAMPLE = ROOT / "examples" / "hello-workflow.yaml"
LONG = "echo " + "x" * 100
MANIFEST = f"""apiVersion: durable-sandbox.dev/v1alpha1
kind: Workflow
metadata: {{name: show}}
spec:
  sandbox: {{provider: local}}
  toolCalls:
    - {{type: write_file, path: notes/a.txt, contents: "one\\ntwo\\n"}}
    - {{type: shell, command: "{LONG}; echo err-line >&2"}}
    - {{type: shell, command: "printf 'first\\\\nsecond\\\\n'"}}
"""



@pytest.fixture
def shown(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "show.yaml"
    path.write_text(MANIFEST)
    run = dsb("run", str(path), "--run-id", "show-1")
    assert run.exit_code == 0, run.output
    state = json.loads(dsb("-o", "json", "inspect", "show-1").stdout)
    return {"run": run.stdout, "state": state}


def call_ids(state: dict[str, Any]) -> list[str]:
    return [op["opId"] for op in state["operations"] if op["kind"] == "sandbox.call"]


def test_tables_name_calls_by_type_and_excerpt_with_short_ids(shown: dict[str, Any]) -> None:
    ids = call_ids(shown["state"])
    assert len(ids) == 3 and all(len(i) > 40 for i in ids)
    short = [i.split("/")[0] + "/" + i.split("/")[1][:10] + "…" for i in ids]
    cut = "shell: " + (LONG + "; echo err-line >&2")[:31] + "…"
    for command in (["inspect", "show-1"], ["history", "show-1"]):
        table = dsb(*command).stdout
        assert "write_file: notes/a.txt" in table and cut in table, table
        assert all(s in table for s in short) and not any(i in table for i in ids), table
        wide = dsb(*command, "-o", "wide").stdout
        assert all(i in wide for i in ids), wide
    # The run's own lines say the same, as each call completes.
    lines = shown["run"].splitlines()
    assert any(f"write_file: notes/a.txt [{short[0]}] exit 0" in line for line in lines), lines
    assert any(f"{cut} [{short[1]}] exit 0" in line for line in lines), lines
    # JSON carries every id in full, and each call's command or path.
    calls = [op for op in shown["state"]["operations"] if op["kind"] == "sandbox.call"]
    assert [op["target"] for op in calls] == ["notes/a.txt", LONG + "; echo err-line >&2", "printf 'first\\nsecond\\n'"]


def test_cut_text_ends_with_an_ellipsis(shown: dict[str, Any]) -> None:
    long_out = "x" * 100
    table = dsb("inspect", "show-1").stdout
    # The call's detail is its first line of stderr (else stdout); a long one is cut with an ellipsis.
    assert "exit 0: err-line" in table
    assert render.op_detail("sandbox.call", "completed", {"exitCode": 0, "stdout": long_out}, None, None) == (
        "exit 0: " + "x" * 59 + "…"
    )
    assert render.excerpt("a\n  b\tc", 10) == "a b c" and render.excerpt("abcdef", 4) == "abc…"


def test_runs_and_inspect_show_the_manifest_workflow_name() -> None:
    assert dsb("run", str(EXAMPLE), "--run-id", "hello-1").exit_code == 0
    row = next(line for line in dsb("runs").stdout.splitlines() if "hello-1" in line)
    assert [cell.strip() for cell in row.strip("│ ").split("│")][:2] == ["hello-1", "hello"]
    wide = next(line for line in dsb("runs", "-o", "wide").stdout.splitlines() if "hello-1" in line)
    assert "hello (sandbox-agent)" in wide
    assert "Workflow    hello (sandbox-agent)" in dsb("inspect", "hello-1").stdout


def test_logs_show_calls_stdout_and_stderr(shown: dict[str, Any]) -> None:
    plain = dsb("logs", "show-1").stdout
    assert "stdout |" not in plain
    lines = dsb("logs", "show-1", "--call-output").stdout.splitlines()
    assert "    stderr | err-line" in lines and "    stdout | " + "x" * 100 in lines
    at = lines.index("    stdout | first")
    assert lines[at + 1] == "    stdout | second" and "call.completed" in lines[at - 1]
    events = [json.loads(line) for line in dsb("-o", "json", "logs", "show-1").stdout.splitlines()]
    completed = [e for e in events if e["type"] == "call.completed"]
    assert [e.get("stdout") for e in completed] == ["wrote notes/a.txt 8 bytes", "x" * 100 + "\n", "first\nsecond\n"]
    assert completed[1]["stderr"] == "err-line\n"


def _is_rfc3339(value: Any) -> bool:
    return isinstance(value, str) and value.endswith("Z") and datetime.fromisoformat(value).tzinfo is not None


def test_json_times_are_rfc3339(shown: dict[str, Any]) -> None:
    state = shown["state"]
    assert _is_rfc3339(state["createdAt"]) and _is_rfc3339(state["updatedAt"]) and state["wakeAt"] is None
    assert all(_is_rfc3339(op["startedAt"]) and _is_rfc3339(op["finishedAt"]) for op in state["operations"])
    created = datetime.fromisoformat(state["createdAt"]).timestamp()
    assert abs(created - time.time()) < 3600  # a real time, not an epoch number read as one
    history = json.loads(dsb("-o", "json", "history", "show-1").stdout)
    assert all(_is_rfc3339(r["ts"]) for r in history)
    runs = json.loads(dsb("-o", "json", "runs").stdout)
    assert _is_rfc3339(runs[0]["createdAt"]) and _is_rfc3339(runs[0]["updatedAt"])
    events = [json.loads(line) for line in dsb("-o", "json", "logs", "show-1").stdout.splitlines()]
    assert events and all(_is_rfc3339(e["ts"]) for e in events)


def test_agent_progress_counts_the_call_in_flight(shown: dict[str, Any]) -> None:
    events = [json.loads(line) for line in dsb("-o", "json", "logs", "show-1").stdout.splitlines()]
    order = [(e["type"], e.get("message")) for e in events if e["type"] in ("progress", "call.started")]
    assert order == [
        ("progress", "call 1/3"), ("call.started", None),
        ("progress", "call 2/3"), ("call.started", None),
        ("progress", "call 3/3"), ("call.started", None),
        ("progress", "3 calls done"),
    ]
    percents = [e["percent"] for e in events if e["type"] == "progress"]
    assert [round(p) for p in percents] == [0, 33, 67, 100]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_shows_the_operation_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", _Terminal())
    display = RichDisplay(render.console(), "show-1")

    def line() -> str:
        return str(display.progress.tasks[0].description)

    now = time.time()
    call = {"kind": "sandbox.call", "opId": "sandbox/dsv1_0123456789abcdef", "name": "shell", "target": "sleep 5", "ts": now}
    display.event({"type": "progress", "message": "call 2/3", "percent": 33, "ts": now})
    assert line() == "call 2/3"
    display.event({**call, "type": "call.started"})
    assert line() == "call 2/3: sandbox.call shell: sleep 5"
    display.event({**call, "type": "call.completed", "exitCode": 0})
    assert line() == "call 2/3"
    display.close()


def test_finalize_is_not_a_second_destroy(shown: dict[str, Any]) -> None:
    events = [json.loads(line) for line in dsb("-o", "json", "logs", "show-1").stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types.count("sandbox.destroyed") == 1 and types.count("sandbox.finalized") == 1
    destroyed = next(e for e in events if e["type"] == "sandbox.destroyed")
    assert destroyed["opId"] == "sandbox/destroy/" + shown["state"]["result"]["sandboxId"]
    assert any(line.endswith("sandbox.finalized          finalize [sandbox/finalize] finalized")
               for line in shown["run"].splitlines()), shown["run"]
