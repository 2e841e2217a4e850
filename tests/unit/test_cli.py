"""The `dsb` CLI: exit codes, errors, output formats, the signal/resume flow, manifests and `runs` filters.

Most tests drive the click command in-process (CliRunner); a few run the installed `dsb` console
script as a subprocess, the way users do, to prove the entry point, exit codes and stderr for real.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import durable_sandbox
from durable_sandbox.engine.driver import RetrySchedule, RunPolicy
from durable_sandbox.stores import SqliteStore
from tests.dsb import ROOT, Ran, dsb
from tests.unit import cli_flows

EXAMPLE = ROOT / "examples" / "hello-workflow.yaml"
FLOWS = "tests.unit.cli_flows"


def as_json(result: Ran) -> Any:
    return json.loads(result.stdout)


# ------------------------------------------------------------------ running Python workflows


def test_run_entrypoint_succeeds(home: Path) -> None:
    result = dsb("run", f"{FLOWS}:doubler", "--input", '{"x": 21}', "--run-id", "r1")
    assert result.exit_code == 0, result.output
    assert "step.completed" in result.stdout and "[double]" in result.stdout  # the operation, as it completed
    assert "run r1 succeeded" in result.stdout and '"doubled": 42' in result.stdout
    assert (home / "runs.db").exists()


def test_run_json_output_is_the_run_state() -> None:
    result = dsb("-o", "json", "run", f"{FLOWS}:doubler", "--input", '{"x": 2}')
    assert result.exit_code == 0
    state = as_json(result)
    assert state["status"] == "succeeded" and state["result"] == {"doubled": 4}
    assert state["runId"].startswith("run-") and state["operations"][0]["opId"] == "double"


def test_run_failure_exits_1() -> None:
    result = dsb("run", f"{FLOWS}:boom", "--run-id", "b1")
    assert result.exit_code == 1
    assert "run b1 failed" in result.stdout and "kaboom" in result.stdout
    assert dsb("-o", "json", "inspect", "b1").exit_code == 0


def test_input_file_and_stdin(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text('{"x": 5}')
    assert '"doubled": 10' in dsb("run", f"{FLOWS}:doubler", "--input-file", str(path)).stdout
    assert '"doubled": 14' in dsb("run", f"{FLOWS}:doubler", "--input-file", "-", input='{"x": 7}').stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", f"{FLOWS}:doubler", "--input", "{x: 1"], "error: --input is not valid JSON: "),
        (["run", f"{FLOWS}:greet", "--input", '{"times": 2}'], "error: input.name: Field required"),
        (["run", f"{FLOWS}:greet", "--input", '{"name": "a", "times": "x"}'], "error: input.times: Input should be"),
        (["run", f"{FLOWS}:approval"], "error: input: Input should be a valid dictionary"),
        (["run", f"{FLOWS}:nosuch"], "error: Module 'tests.unit.cli_flows' has no attribute 'nosuch'"),
        (["run", "nosuchmodule:fn"], "error: Cannot import module 'nosuchmodule'"),
        (["run", "not-a-workflow"], "error: Unknown workflow 'not-a-workflow'"),
        (["run", "missing.yaml"], "error: missing.yaml: no such manifest file"),
        (["run", str(EXAMPLE), "--input", "{}"], "error: --input/--input-file apply to module:function targets"),
        (["run", f"{FLOWS}:doubler", "--input", "{}", "--input-file", "x"], "error: give --input or --input-file"),
    ],
)
def test_invalid_input_exits_2(args: list[str], message: str) -> None:
    result = dsb(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert dsb("-o", "json", "runs").stdout.strip() == "[]"  # nothing was started


@pytest.mark.parametrize("command", [["inspect"], ["history"], ["resume"], ["cancel"], ["logs"], ["signal", "x", "1"]])
def test_unknown_run_id_exits_2(command: list[str]) -> None:
    args = [command[0], "no-such-run", *command[1:]]
    result = dsb(*args)
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: Run 'no-such-run' does not exist in this store; list runs with `dsb runs`."


def test_usage_errors_exit_2() -> None:
    assert dsb("runs", "--status", "bogus").exit_code == 2
    assert dsb("-o", "xml", "runs").exit_code == 2
    assert dsb("inspect").exit_code == 2


# ------------------------------------------------------------------ waiting, signal, resume


def test_waiting_run_exits_3_and_says_how_to_continue() -> None:
    result = dsb("run", f"{FLOWS}:approval", "--input", '{"x": 3}', "--run-id", "a1")
    assert result.exit_code == 3
    assert "run a1 is waiting" in result.stdout
    assert "waiting on callback(s): approve" in result.stderr
    assert "dsb signal a1 approve '<JSON value>'" in result.stderr and "dsb resume a1" in result.stderr
    assert 'approve payload: {"prepared":6}' in result.stderr

    state = as_json(dsb("-o", "json", "inspect", "a1"))
    assert state["status"] == "waiting" and state["pendingCallbacks"] == [{"id": "approve", "payload": {"prepared": 6}}]

    bad = dsb("signal", "a1", "approve", "{not json")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: VALUE_JSON is not valid JSON")

    signalled = dsb("signal", "a1", "approve", '{"ok": true}')
    assert signalled.exit_code == 0 and "signalled approve of run a1" in signalled.stdout
    assert dsb("signal", "a1", "approve", '{"ok": true}').exit_code == 0  # same value: a no-op
    conflict = dsb("signal", "a1", "approve", '{"ok": false}')
    assert conflict.exit_code == 2 and "already signalled with a different value" in conflict.stderr

    resumed = dsb("resume", "a1")
    assert resumed.exit_code == 0, resumed.output
    assert "callback.completed" in resumed.stdout and "[prepare]" not in resumed.stdout  # only new work shown
    assert as_json(dsb("-o", "json", "inspect", "a1"))["result"] == {"prepared": 6, "verdict": {"ok": True}}

    finished = dsb("signal", "a1", "approve", '{"ok": true}')
    assert finished.exit_code == 2 and "has succeeded; it no longer takes signals" in finished.stderr


def test_signal_with_resume_flag_and_store_option(tmp_path: Path) -> None:
    store = str(tmp_path / "elsewhere.db")
    assert dsb("--store", store, "run", f"{FLOWS}:approval", "--input", "{}", "--run-id", "a2").exit_code == 3
    waiting = dsb("--store", store, "resume", "a2")
    assert waiting.exit_code == 3 and f"dsb --store {store} signal a2 approve" in waiting.stderr
    assert dsb("inspect", "a2").exit_code == 2  # not in the default store
    result = dsb("--store", store, "-o", "yaml", "signal", "a2", "approve", "7", "--resume")
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["result"] == {"prepared": 2, "verdict": 7}


def test_cancel_waiting_run() -> None:
    assert dsb("run", f"{FLOWS}:approval", "--input", "{}", "--run-id", "c1").exit_code == 3
    result = dsb("cancel", "c1", "--reason", "not needed")
    assert result.exit_code == 0 and "run c1 cancelled: not needed" in result.stdout
    state = as_json(dsb("-o", "json", "inspect", "c1"))
    assert state["status"] == "cancelled" and state["error"]["message"] == "not needed"
    assert dsb("resume", "c1").exit_code == 1
    again = dsb("cancel", "c1")
    assert again.exit_code == 0 and "already finished (cancelled)" in again.stdout


# ------------------------------------------------------------------ output formats and listing


def test_inspect_and_history_formats() -> None:
    dsb("run", f"{FLOWS}:doubler", "--input", '{"x": 1}', "--run-id", "f1")
    table = dsb("inspect", "f1")
    assert table.exit_code == 0
    for text in ("f1", "succeeded", "Operations (1)", "double", "Result"):
        assert text in table.stdout
    as_yaml = yaml.safe_load(dsb("-o", "yaml", "inspect", "f1").stdout)
    assert as_yaml == as_json(dsb("-o", "json", "inspect", "f1"))
    assert as_yaml["workflow"] == f"{FLOWS}:doubler"
    records = as_json(dsb("-o", "json", "history", "f1"))
    assert [(r["opId"], r["status"]) for r in records] == [("double", "started"), ("double", "completed")]
    assert "History of f1 (2 records)" in dsb("history", "f1").stdout


def test_logs() -> None:
    dsb("run", f"{FLOWS}:doubler", "--run-id", "l1")
    text = dsb("logs", "l1")
    assert text.exit_code == 0
    assert "run.started" in text.stdout and "step.completed" in text.stdout and "doubled (100%)" in text.stdout
    events = [json.loads(line) for line in dsb("-o", "json", "logs", "l1", "-f").stdout.splitlines()]
    assert {"run.started", "step.started", "step.completed", "progress", "run.succeeded"} <= {e["type"] for e in events}


def test_runs_filters() -> None:
    dsb("run", f"{FLOWS}:doubler", "--run-id", "ok-1")
    dsb("run", f"{FLOWS}:doubler", "--run-id", "ok-2")
    dsb("run", f"{FLOWS}:boom", "--run-id", "bad-1")
    dsb("run", f"{FLOWS}:approval", "--input", "{}", "--run-id", "wait-1")

    def ids(*args: str) -> list[str]:
        return sorted(r["runId"] for r in as_json(dsb("-o", "json", "runs", *args)))

    assert ids() == ["bad-1", "ok-1", "ok-2", "wait-1"]
    assert ids("--status", "succeeded") == ["ok-1", "ok-2"]
    assert ids("--status", "failed", "--status", "waiting") == ["bad-1", "wait-1"]
    assert ids("--workflow", f"{FLOWS}:doubler") == ["ok-1", "ok-2"]
    assert ids("--workflow", f"{FLOWS}:doubler", "--status", "failed") == []
    assert len(ids("--limit", "1")) == 1
    table = dsb("runs", "--status", "waiting").stdout
    assert "wait-1" in table and "approve" in table and "ok-1" not in table


# ------------------------------------------------------------------ manifests


def test_run_example_manifest() -> None:
    result = dsb("-o", "json", "run", str(EXAMPLE))
    assert result.exit_code == 0, result.output
    state = as_json(result)
    assert state["workflow"] == "sandbox-agent" and state["runId"].startswith("hello-")
    results = state["result"]["toolResults"]
    assert [r["exitCode"] for r in results] == [0, 0, 0, 2]  # the failing command is a completed call
    assert results[2]["stdout"] == "hello from durable-sandbox\n"
    assert "hello, 1 line(s)" in results[1]["stdout"]
    kinds = [op["kind"] for op in state["operations"]]
    assert kinds.count("sandbox.snapshot") == 2 and "sandbox.destroy" in kinds
    # Same manifest, same run: running it again does not run the calls again.
    again = as_json(dsb("-o", "json", "run", str(EXAMPLE)))
    assert again["runId"] == state["runId"] and again["result"] == state["result"]
    listed = as_json(dsb("-o", "json", "runs", "--workflow", "sandbox-agent"))
    assert listed[0]["labels"] == {"durable-sandbox.dev/workflow": "hello"}


def test_run_manifest_table_output() -> None:
    result = dsb("run", str(EXAMPLE), "--run-id", "hello-table")
    assert result.exit_code == 0
    assert "run hello-table (Workflow/hello)" in result.stdout
    assert result.stdout.count("call.completed") == 4 and "exit 2" in result.stdout
    assert "sandbox.snapshot" in result.stdout and "run hello-table succeeded" in result.stdout


def test_invalid_manifest_exits_2_with_field_paths(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: durable-sandbox.dev/v1alpha1\nkind: Workflow\nmetadata: {name: bad}\n"
        "spec:\n  snapshotEveryNCalls: -2\n  toolCalls:\n    - {type: shell}\n    - {type: rm, path: x}\n"
    )
    result = dsb("run", str(path))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}: document 1 Workflow/bad: spec.toolCalls[0].command: Field required",
        f"error: {path}: document 1 Workflow/bad: spec.toolCalls[1].type: unknown tool type 'rm'; "
        "expected one of shell, write_file, read_file",
        f"error: {path}: document 1 Workflow/bad: spec.snapshotEveryNCalls: Input should be greater than or equal to 0",
    ]


def manifest(tmp_path: Path, spec: str, extra: str = "") -> str:
    path = tmp_path / "wf.yaml"
    path.write_text(
        f"apiVersion: durable-sandbox.dev/v1alpha1\nkind: Workflow\nmetadata: {{name: wf}}\nspec:\n{spec}{extra}"
    )
    return str(path)


def test_secret_reference_cannot_run_locally(tmp_path: Path) -> None:
    path = manifest(
        tmp_path,
        "  toolCalls: [{type: shell, command: env}]\n  sandbox:\n    env:\n"
        "      - {name: OK, value: x}\n      - {name: TOKEN, valueFrom: {secretKeyRef: {name: creds, key: token}}}\n",
    )
    result = dsb("run", path)
    assert result.exit_code == 2
    assert "Workflow/wf: spec.sandbox.env[1].valueFrom: Secret creds/token can only be read in a cluster" in result.stderr


def test_cluster_only_fields_warn_and_sandbox_ref_resolves_in_file(tmp_path: Path) -> None:
    path = manifest(
        tmp_path,
        "  toolCalls: [{type: shell, command: 'echo $WHO'}]\n  sandboxRef: {name: box}\n"
        "  ttlSecondsAfterFinished: 30\n  suspend: true\n",
        "---\napiVersion: durable-sandbox.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: box}\n"
        "spec: {provider: local, env: [{name: WHO, value: box-env}]}\n",
    )
    result = dsb("-o", "json", "run", path)
    assert result.exit_code == 0, result.output
    assert as_json(result)["result"]["toolResults"][0]["stdout"] == "box-env\n"
    assert "warning: " in result.stderr and "spec.ttlSecondsAfterFinished: only meaningful in a cluster" in result.stderr
    assert "spec.suspend: only meaningful in a cluster" in result.stderr


def test_manifest_entrypoint_with_signals(tmp_path: Path) -> None:
    path = manifest(
        tmp_path, f"  entrypoint: {FLOWS}:approval\n  input: {{x: 4}}\n  signals: {{approve: {{by: manifest}}}}\n"
    )
    result = dsb("-o", "json", "run", path, "--run-id", "m1")
    assert result.exit_code == 0, result.output
    assert as_json(result)["result"] == {"prepared": 8, "verdict": {"by": "manifest"}}


def test_manifest_entrypoint_waits_then_rerun_continues(tmp_path: Path) -> None:
    path = manifest(tmp_path, f"  entrypoint: {FLOWS}:approval\n  input: {{x: 1}}\n")
    first = dsb("run", path)
    assert first.exit_code == 3
    run_id = as_json(dsb("-o", "json", "runs"))[0]["runId"]
    assert run_id.startswith("wf-")
    assert dsb("signal", run_id, "approve", "true").exit_code == 0
    assert dsb("run", path).exit_code == 0  # the same manifest continues the same run


def test_manifest_entrypoint_input_is_validated(tmp_path: Path) -> None:
    path = manifest(tmp_path, f"  entrypoint: {FLOWS}:greet\n  input: {{times: 1}}\n")
    result = dsb("run", path)
    assert result.exit_code == 2 and "Workflow/wf: spec.input.name: Field required" in result.stderr


def test_manifest_cancel_and_retry(tmp_path: Path) -> None:
    cancelled = dsb("run", manifest(tmp_path, f"  entrypoint: {FLOWS}:approval\n  input: {{}}\n  cancel: true\n"))
    assert cancelled.exit_code == 1 and "cancelled" in cancelled.stdout
    retried = dsb(
        "run",
        manifest(tmp_path, f"  entrypoint: {FLOWS}:boom\n  retry: {{maxAttempts: 2, initialIntervalSeconds: 0}}\n"),
    )
    assert retried.exit_code == 1
    assert "retrying (attempt 2/2)" in retried.stderr


def test_manifest_from_stdin() -> None:
    result = dsb("-o", "json", "run", "-", "--run-id", "stdin-1", input=EXAMPLE.read_text())
    assert result.exit_code == 0 and as_json(result)["runId"] == "stdin-1"


# ------------------------------------------------------------------ the installed console script


def sh(home: Path, *args: str) -> Ran:
    return dsb(*args, home=home, process=True)


def test_console_script_exit_codes(home: Path) -> None:
    ok = sh(home, "run", "examples.flows.hello_flow:hello", "--input", '{"name": "Ada"}')
    assert ok.returncode == 0, ok.stderr
    assert '"greeting": "Hello, Ada!"' in ok.stdout

    failed = sh(home, "run", f"{FLOWS}:boom")
    assert failed.returncode == 1 and "kaboom" in failed.stdout

    unknown = sh(home, "inspect", "nope")
    assert unknown.returncode == 2
    assert unknown.stderr == "error: Run 'nope' does not exist in this store; list runs with `dsb runs`.\n"

    malformed = sh(home, "run", "examples.flows.hello_flow:hello", "--input", "{")
    assert malformed.returncode == 2 and malformed.stderr.startswith("error: --input is not valid JSON")
    assert "Traceback" not in malformed.stderr


def test_console_script_signal_resume_across_processes(home: Path) -> None:
    waiting = sh(home, "run", "examples.flows.hello_flow:hello", "--input", '{"name": "Bo", "approve": true}',
                 "--run-id", "p1")
    assert waiting.returncode == 3, waiting.stderr
    assert "dsb signal p1 approval '<JSON value>'" in waiting.stderr
    assert sh(home, "signal", "p1", "approval", '{"approved": true}').returncode == 0
    resumed = sh(home, "-o", "json", "resume", "p1")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"]["approval"] == {"approved": True}
    listed = json.loads(sh(home, "-o", "json", "runs", "--status", "succeeded").stdout)
    assert [r["runId"] for r in listed] == ["p1"]


def test_console_script_runs_example_manifest(home: Path) -> None:
    result = sh(home, "run", "examples/hello-workflow.yaml")
    assert result.returncode == 0, result.stderr
    assert "call.completed" in result.stdout and "exit 2" in result.stdout  # plain lines: stdout is not a TTY
    bad = sh(home, "run", "examples/flows/__init__.py.yaml")
    assert bad.returncode == 2


def test_docs_cli_examples_work(home: Path) -> None:
    """Every `dsb ...` command in a code block of docs/cli.md (tests/docs_commands.py) runs, in order, as written;
    one whose transcript shows `error: ` lines exits 2 with exactly those lines on stderr, and a transcript's
    `echo $?` shows the exit of the command before it."""
    import shlex

    from tests.docs_commands import CLI, all_commands, commands_run_by

    commands = commands_run_by(CLI, "docs/cli.md")
    assert len(commands) >= 15 and sum(1 for c in commands if c.output and c.output[0].startswith("error: ")) >= 4
    previous: dict[str, object] = {}  # the command just before, in the doc, and its exit when this test ran it
    order = [c for c in all_commands() if c.doc == "docs/cli.md"]
    for command in commands:
        before = order[order.index(command) - 1]
        if command.text == "echo $?":
            if previous.get("command") == before:  # else the test that runs that command checks its exit
                assert command.output == (str(previous["code"]),), f"{before.text}: exit {previous['code']}"
            continue
        done = sh(home, *shlex.split(command.text)[1:])
        errors = [line for line in command.output if line.startswith("error: ")]
        if errors:
            assert (done.returncode, done.stderr.splitlines()) == (2, errors), command.text
        else:
            assert done.returncode in (0, 3), f"{command.text}: exit {done.returncode}\n{done.stderr}"
        previous = {"command": command, "code": done.returncode}


def test_docs_cli_dry_run_transcript_is_what_dsb_prints(home: Path) -> None:
    """The `dsb run --dry-run` transcript in docs/cli.md is the real output, run id included: the id is a hash of
    the manifest's program and input, so a change to either (or to the models' defaults) must update the doc."""
    command = "dsb run --dry-run examples/hello-workflow.yaml"
    lines = (ROOT / "docs" / "cli.md").read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    documented = lines[start : lines.index("```", start)]
    done = sh(home, *command.split()[1:])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == documented


def test_output_and_store_options_also_work_after_the_command(tmp_path: Path) -> None:
    """`dsb runs -o json` and `dsb inspect RUN --store F` behave like the global forms, as in kubectl."""
    store = tmp_path / "elsewhere.db"
    first = dsb("run", "examples/hello-workflow.yaml", "--store", str(store), "-o", "json", process=True)
    assert first.returncode == 0, first.stderr
    listed = dsb("runs", "--store", str(store), "-o", "json", process=True)
    assert listed.returncode == 0, listed.stderr
    [run] = json.loads(listed.stdout)
    assert run["status"] == "succeeded"
    default_store = dsb("runs", "-o", "json", process=True)
    assert json.loads(default_store.stdout) == [], "--store after the command chose the other store"


def test_dsb_worker_wakes_a_due_durable_timer_and_finishes_the_run(tmp_path: Path) -> None:
    """`dsb worker --until-idle` executes runnable runs, here one whose durable sleep is due."""
    store = tmp_path / "runs.db"

    def run(*args: str) -> Ran:
        return dsb(*args, store=store, process=True)

    started = run("run", "tests.unit.cli_flows:napper", "--input", '{"seconds": 3600}', "--run-id", "nap")
    assert started.returncode == 3, started.stdout + started.stderr  # waiting on its timer
    # The timer is made due through the store, as time passing would (no waiting in a test).
    import sqlite3

    with sqlite3.connect(store) as db:
        db.execute("UPDATE ops SET meta=json_set(meta, '$.wakeAt', 0) WHERE op_id='nap'")
        db.execute("UPDATE runs SET wake_at=0 WHERE run_id='nap'")
    served = run("worker", "--until-idle", "--poll-interval", "0.05")
    assert served.returncode == 0, served.stderr
    state = json.loads(run("-o", "json", "inspect", "nap").stdout)
    assert state["status"] == "succeeded" and state["result"] == "rested"


def test_a_run_in_a_retry_backoff_is_shown_retrying_not_failed(home: Path) -> None:
    """A failed run that its recorded spec.retry will try again (`dsb run` sleeps through the backoff; `dsb
    worker` picks it up) is not finished: `dsb inspect` and `dsb runs` say retrying, which attempt and when."""
    async def fail_once() -> None:
        engine = durable_sandbox.Engine(SqliteStore(home / "runs.db"), worker_id="w")
        try:
            policy = RunPolicy(retry=RetrySchedule(max_attempts=2, initial_interval=3600))
            state = await engine.run(cli_flows.boom, run_id="bo", labels=policy.to_labels())
            assert state.status == "failed"
        finally:
            await engine.aclose()

    asyncio.run(fail_once())
    shown = dsb("inspect", "bo")
    assert shown.exit_code == 0, shown.output
    assert "retrying" in shown.stdout and "Next attempt  2 of 2 at " in shown.stdout, shown.stdout
    assert "Attempt 1 of 2 failed: " in shown.stdout and "kaboom" in shown.stdout
    doc = as_json(dsb("-o", "json", "inspect", "bo"))
    assert doc["status"] == "failed" and doc["nextAttempt"]["attempt"] == 2 and doc["nextAttempt"]["maxAttempts"] == 2
    listed = dsb("runs")
    assert "retrying (2/2 at " in listed.stdout, listed.stdout
    assert as_json(dsb("-o", "json", "runs"))[0]["nextAttempt"]["attempt"] == 2
