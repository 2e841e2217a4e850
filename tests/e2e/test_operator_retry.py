"""A run in a retry's backoff (spec.retry) is not finished, and nothing of the Workflow says it is: phase
Retrying, Failed and Succeeded both False, wakeAt the next attempt's time, attempt n of maxAttempts, one
Retrying Event per retry. What a CI gate runs, `kubectl wait --for=condition=Failed`, returns once the last
attempt failed, not at the first; `--for=condition=Succeeded` returns when a retry succeeds."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import condition, events, manifest, namespace, operators, status

__all__ = ["namespace", "operators"]  # fixtures

# CI runs these under the PostgreSQL journal too: once per journal (tests/e2e/journal_support.py).
pytestmark = pytest.mark.both_journals

BACKOFF = 8  # seconds: long enough to look at the Workflow while it waits


def _wait_for(cp: ControlPlane, ns: str, name: str, ctype: str) -> subprocess.Popen[str]:
    """`kubectl wait --for=condition=<ctype>` as a CI gate runs it, in the background."""
    return subprocess.Popen(
        [cp.kubectl_bin, f"--kubeconfig={cp.kubeconfig}", "wait", f"--for=condition={ctype}", f"workflow/{name}",
         "-n", ns, "--timeout=180s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_retry_in_backoff_is_not_final(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    cp = control_plane
    operators("--allow-local-provider")
    marker = tmp_path / "first-attempt-done"
    retry = {"maxAttempts": 2, "initialIntervalSeconds": BACKOFF}
    fail = {"failurePolicy": {"onNonZeroExit": "fail"}}
    cp.apply(manifest("doomed", snapshotEveryNCalls=0, retry=retry,
                      toolCalls=[{"type": "shell", "command": "echo nope >&2; exit 7", **fail}]), "-n", namespace)
    cp.apply(manifest("flaky", snapshotEveryNCalls=0, retry=retry, toolCalls=[
        {"type": "shell", "command": f"if [ -e {marker} ]; then echo recovered; else touch {marker}; exit 7; fi",
         **fail}]), "-n", namespace)
    failed_gate = _wait_for(cp, namespace, "doomed", "Failed")
    succeeded_gate = _wait_for(cp, namespace, "flaky", "Succeeded")
    try:
        try:
            wait_until(lambda: status(cp, namespace, "doomed").get("phase") == "Retrying", 90,
                       "the first attempt to fail and the backoff to be shown")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; status: {status(cp, namespace, 'doomed')}") from None
        st = status(cp, namespace, "doomed")
        assert (st["attempt"], st["maxAttempts"]) == (1, 2) and st["wakeAt"] and st.get("finishedAt") is None, st
        for ctype in ("Failed", "Succeeded"):
            cond = condition(cp, namespace, "doomed", ctype)
            assert cond is not None and cond["status"] == "False" and cond["reason"] == "Retrying", cond
        failed_cond = condition(cp, namespace, "doomed", "Failed")
        assert failed_cond is not None
        assert "attempt 1 of 2 failed" in failed_cond["message"] and "attempt 2 of 2 starts at" in failed_cond["message"]
        assert failed_gate.poll() is None, f"kubectl wait --for=condition=Failed returned in the backoff: {st}"
        retrying = [e for e in events(cp, namespace, "doomed") if e["reason"] == "Retrying"]
        assert len(retrying) == 1 and retrying[0]["type"] == "Warning" and "attempt 1 of 2" in retrying[0]["message"]

        _, err = failed_gate.communicate(timeout=150)
        assert failed_gate.returncode == 0, err
        st = status(cp, namespace, "doomed")  # the gate returned only once the last attempt had failed
        assert (st["phase"], st["attempt"]) == ("Failed", 2) and st.get("wakeAt") is None, st
        # What failed is where a person looks first: the failing call's command and the end of its stderr in
        # the Failed condition and status.error (so `kubectl describe`), and the command in recentOperations.
        described = cp.kubectl("describe", "workflow", "doomed", "-n", namespace).stdout
        assert "command: echo nope >&2; exit 7; stderr: nope" in st["error"]["message"], st["error"]
        assert "command: echo nope >&2; exit 7; stderr: nope" in " ".join(described.split()), described
        calls = [op for op in st["recentOperations"] if op["kind"] == "sandbox.call"]
        assert calls and calls[-1]["target"] == "echo nope >&2; exit 7" and calls[-1]["exitCode"] == 7, calls

        _, err = succeeded_gate.communicate(timeout=150)
        assert succeeded_gate.returncode == 0, err
        st = status(cp, namespace, "flaky")
        assert (st["phase"], st["attempt"]) == ("Succeeded", 2), st
        assert st["result"]["toolResults"][-1]["stdout"] == "recovered\n"
        assert [e["reason"] for e in events(cp, namespace, "flaky")].count("Retrying") == 1
    finally:
        for gate in (failed_gate, succeeded_gate):
            if gate.poll() is None:
                gate.kill()
                gate.communicate()
