"""A Workflow can fail on purpose: `failurePolicy` (per Workflow, per call) makes a nonzero exit or a
timed-out call fail the run, so `dsb run` exits 1 (CI can gate on it) and `spec.retry` re-runs the call.
The default keeps the seed's rule: a nonzero exit is a completed call."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from durable_sandbox.kube.api.resources import API_VERSION
from durable_sandbox.kube.spec.manifests import ManifestError, load_manifests
from tests.dsb import dsb


def manifest(tmp_path: Path, spec: str, name: str = "gate") -> str:
    path = tmp_path / f"{name}.yaml"
    body = textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ")
    path.write_text(f"apiVersion: {API_VERSION}\nkind: Workflow\nmetadata:\n  name: {name}\nspec:\n{body}\n")
    return str(path)


def test_default_keeps_a_nonzero_exit_a_completed_call(tmp_path: Path) -> None:
    result = dsb("-o", "json", "run", manifest(tmp_path, "toolCalls:\n  - {type: shell, command: exit 3}\n"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result"]["toolResults"][0]["exitCode"] == 3


def test_workflow_policy_fails_the_run_on_a_nonzero_exit(tmp_path: Path) -> None:
    spec = """
        failurePolicy: {onNonZeroExit: fail}
        toolCalls:
          - {type: shell, command: echo before}
          - {type: shell, command: exit 3}
          - {type: write_file, path: never.txt, contents: x}
    """
    result = dsb("-o", "json", "run", manifest(tmp_path, spec))
    assert result.exit_code == 1, result.output
    state = json.loads(result.stdout)
    assert state["status"] == "failed"
    assert state["error"]["type"] == "ToolCallFailed"
    assert "toolCalls[1]" in state["error"]["message"] and "exit code 3" in state["error"]["message"]
    calls = [op for op in state["operations"] if op["kind"] == "sandbox.call"]
    assert [c["status"] for c in calls] == ["completed", "failed"]  # the third call never ran


def test_call_policy_overrides_the_workflow_policy(tmp_path: Path) -> None:
    spec = """
        failurePolicy: {onNonZeroExit: fail}
        toolCalls:
          - {type: shell, command: exit 4, failurePolicy: {onNonZeroExit: continue}}
          - {type: read_file, path: missing.txt, failurePolicy: {onNonZeroExit: continue}}
    """
    assert dsb("run", manifest(tmp_path, spec)).exit_code == 0
    strict_call = "toolCalls:\n  - {type: read_file, path: missing.txt, failurePolicy: {onNonZeroExit: fail}}\n"
    assert dsb("run", manifest(tmp_path, strict_call, name="strict")).exit_code == 1


def test_on_timeout_fails_the_run(tmp_path: Path) -> None:
    spec = """
        toolCalls:
          - {type: shell, command: sleep 30, timeout: 0.2, failurePolicy: {onTimeout: fail}}
    """
    result = dsb("-o", "json", "run", manifest(tmp_path, spec))
    assert result.exit_code == 1, result.output
    assert "timed out" in json.loads(result.stdout)["error"]["message"]
    # onNonZeroExit does not cover a timeout: the timeout has its own rule.
    lenient = "toolCalls:\n  - {type: shell, command: sleep 30, timeout: 0.2, failurePolicy: {onNonZeroExit: fail, onTimeout: continue}}\n"
    assert dsb("run", manifest(tmp_path, lenient, name="lenient")).exit_code == 0


def test_retry_re_runs_the_failed_call_in_a_sandbox_rebuilt_from_the_journal(tmp_path: Path) -> None:
    """The first attempt fails at the flaky call; the retry provisions a new sandbox, replays the calls that
    completed (the workspace has notes.txt again) and runs the flaky call again, which now succeeds."""
    marker = tmp_path / "attempted"
    spec = f"""
        failurePolicy: {{onNonZeroExit: fail}}
        retry: {{maxAttempts: 3, initialIntervalSeconds: 0}}
        sandbox:
          env:
            - {{name: MARKER, value: {marker}}}
        toolCalls:
          - {{type: write_file, path: notes.txt, contents: kept}}
          - {{type: shell, command: 'test -f "$MARKER" || {{ touch "$MARKER"; exit 1; }}'}}
          - {{type: shell, command: cat notes.txt}}
    """
    result = dsb("-o", "json", "run", manifest(tmp_path, spec))
    assert result.exit_code == 0, result.output
    assert "retrying (attempt 2/3)" in result.stderr
    state = json.loads(result.stdout)
    assert [r["exitCode"] for r in state["result"]["toolResults"]] == [0, 0, 0]
    assert state["result"]["toolResults"][2]["stdout"] == "kept"
    assert marker.exists()


def test_policy_values_and_on_timeout_for_a_file_call_are_refused() -> None:
    head = f"apiVersion: {API_VERSION}\nkind: Workflow\nmetadata:\n  name: bad\nspec:\n"
    with pytest.raises(ManifestError, match=r"spec.failurePolicy.onNonZeroExit: Input should be 'continue' or 'fail'"):
        load_manifests(head + "  failurePolicy: {onNonZeroExit: abort}\n  toolCalls:\n    - {type: shell, command: ls}\n")
    with pytest.raises(ManifestError, match=r"spec.toolCalls\[0\].failurePolicy.onTimeout: only shell calls"):
        load_manifests(head + "  toolCalls:\n    - {type: read_file, path: a, failurePolicy: {onTimeout: fail}}\n")


def test_the_failing_calls_command_and_output_are_where_a_person_looks_first(tmp_path: Path) -> None:
    """The run's error names the failing call's command and ends with what it printed (stderr first), bounded
    and with env values redacted: `dsb inspect`'s table, `dsb logs --call-output` and the run's error (the
    operator's Failed condition and status.error are that error) show it without `-o json`."""
    spec = """
        sandbox:
          env: [{name: TOKEN, value: s3cr3t-value}]
        toolCalls:
          - type: shell
            command: 'for i in $(seq 1 50); do echo "noise $i" >&2; done; echo "token $TOKEN" >&2; echo "error: undefined symbol foo" >&2; exit 1'
            failurePolicy: {onNonZeroExit: fail}
    """
    ran = dsb("-o", "json", "run", manifest(tmp_path, spec), "--run-id", "cc")
    assert ran.exit_code == 1, ran.output
    message = json.loads(ran.stdout)["error"]["message"]
    assert message.startswith("toolCalls[0] failed the run: it exited with exit code 1")
    assert "; command: for i in $(seq 1 50)" in message and "exit 1; stderr: " in message
    assert message.endswith("noise 50 | token *** | error: undefined symbol foo"), message
    assert "noise 1 |" not in message and len(message) < 1024  # the end of the output, bounded
    assert "s3cr3t-value" not in message
    shown = dsb("inspect", "cc", "-o", "table")
    assert "error: undefined symbol foo" in shown.stdout and "command: for i in" in shown.stdout, shown.stdout
    assert "s3cr3t-value" not in shown.output
    # The call's own output, as for every call with --call-output (the journal keeps it as printed).
    logs = dsb("logs", "cc", "--call-output")
    assert "error: undefined symbol foo" in logs.stdout and "noise 1\n" in logs.stdout, logs.stdout
