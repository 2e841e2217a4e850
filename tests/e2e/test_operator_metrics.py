"""Acceptance 5: `/metrics` of a running `dsb operator` (--metrics-port), scraped during and after a run, shows
the counters moving by what the run did; `/healthz` answers; the exposition parses with prometheus-client.

"During" is made deterministic by the workload: the second call waits for a file the test creates after its
first scrape, so the run is certainly mid-way (one call done, Running) when it is scraped."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ControlPlane, wait_until
from tests.e2e.operator_support import manifest, namespace, operators, wait_condition

__all__ = ["namespace", "operators"]  # fixtures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    code, text = get(port, "/metrics")
    assert code == 200, text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in got.items() if n == name and want <= ls)


def test_metrics_move_during_and_after_a_run(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    port = free_port()
    operators("--allow-local-provider", "--metrics-port", str(port))
    wait_until(lambda: get(port, "/healthz")[0] == 200, 60, "/healthz to answer")
    assert get(port, "/healthz") == (200, "ok\n")

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

    # Open (issue 12): deleting the finished Workflow here twice outlasted 60 s in the full suite; the gauge's
    # removal on delete is to be tested again once that is understood.
