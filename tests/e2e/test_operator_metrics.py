"""Acceptance 5: `/metrics` of a running `dsb operator` (--metrics-port), scraped during and after a run, shows
the counters moving by what the run did; `/healthz` answers; the exposition parses with prometheus-client.

"During" is made deterministic by the workload: the second call waits for a file the test creates after its
first scrape, so the run is certainly mid-way (one call done, Running) when it is scraped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    http_get,
    manifest,
    namespace,
    operators,
    scrape,
    total,
    wait_condition,
)
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures


def test_metrics_move_during_and_after_a_run(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    port = free_port()
    operators("--allow-local-provider", "--metrics-port", str(port))
    wait_until(lambda: http_get(port, "/healthz")[0] == 200, 60, "/healthz to answer")
    assert http_get(port, "/healthz") == (200, "ok\n")

    gate = tmp_path / "gate"
    calls = [
        {"type": "write_file", "path": "a.txt", "contents": "one\n"},
        {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo passed"},
        {"type": "shell", "command": "cat a.txt"},
        {"type": "shell", "command": "ls nope"},
    ]
    control_plane.apply(manifest("metered", toolCalls=calls, snapshotEveryNCalls=2), "-n", namespace)

    # During: one call done, the second one blocked on the gate.
    wait_until(lambda: total(scrape(port), "durable_sandbox_tool_calls_total") == 1, 120, "the first tool call")
    # The phase gauge follows the watch and the status patch is coalesced: both arrive after the call is counted,
    # and the gate holds the run in Running until the test opens it, so waiting for them cannot miss the state.
    wait_until(
        lambda: total(scrape(port), "durable_sandbox_workflows", phase="Running") == 1
        and total(scrape(port), "durable_sandbox_kube_api_requests_total", verb="patch", resource="workflows/status") >= 1,
        60,
        "the Running phase in the gauge and a status patch",
    )
    during = scrape(port)
    assert total(during, "durable_sandbox_workflows", phase="Running") == 1
    assert total(during, "durable_sandbox_workflows", phase="Succeeded") == 0
    assert total(during, "durable_sandbox_snapshots_total") == 0
    assert total(during, "durable_sandbox_kube_api_requests_total", verb="patch", resource="workflows/status") >= 1

    gate.touch()
    wait_condition(control_plane, namespace, "metered", "Succeeded", timeout=120)
    wait_until(lambda: total(scrape(port), "durable_sandbox_workflows", phase="Succeeded") == 1, 60,
               "the Succeeded phase in the gauge")
    after = scrape(port)
    assert total(after, "durable_sandbox_tool_calls_total", provider="local") == len(calls)
    assert total(after, "durable_sandbox_tool_calls_total", provider="local", outcome="nonzero_exit") == 1
    assert total(after, "durable_sandbox_tool_call_duration_seconds_count", provider="local") == len(calls)
    assert total(after, "durable_sandbox_snapshots_total", provider="local") == 2
    assert total(after, "durable_sandbox_workflows", phase="Running") == 0
    assert total(after, "durable_sandbox_recoveries_total") == 0
    assert total(after, "durable_sandbox_reconcile_errors_total") == 0
    assert total(after, "durable_sandbox_kube_api_requests_total", code="403") == 0
    for name in ("durable_sandbox_kube_api_requests_total", "durable_sandbox_tool_calls_total"):
        assert total(after, name) >= total(during, name), f"{name} went backwards"

    # Deleting the finished Workflow takes it out of the phase gauges. kubectl waits for the finalizer to go,
    # which it does at once: not at the end of the daemon's 60 s graceful backoff (issue 12, see
    # kube/handlers.py's look_again_when_ended).
    control_plane.kubectl("delete", "workflow", "metered", "-n", namespace, "--timeout=60s")
    wait_until(lambda: total(scrape(port), "durable_sandbox_workflows") == 0, 60, "the gauge to forget it")
    assert total(scrape(port), "durable_sandbox_reconcile_errors_total") == 0
