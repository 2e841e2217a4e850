"""Issue 24, item 4: the operator's log tells a run's life, one INFO line per step, in text and in JSON, and
holds no traceback and no ERROR over a whole run (its start, the CRDs just applied, and its SIGTERM)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.apiserver_support import RestartableAPIServer
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    HELLO,
    lifecycle,
    log_records,
    manifest,
    namespace,
    operators,
    wait_condition,
)

__all__ = ["namespace", "operators"]  # fixtures

OUTAGE = 12.0  # seconds the API server is away in the test of it
LOSSY_CALLS = [{"type": "shell", "operationId": f"c{i}", "command": f"echo c{i}"} for i in range(1, 5)]


def one(lines: list[str], pattern: str) -> str:
    found = [line for line in lines if re.search(pattern, line)]
    assert len(found) == 1, f"{pattern!r}: {len(found)} lifecycle line(s) match, not one: {lines}"
    return found[0]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_one_info_line_per_lifecycle_step_and_nothing_wrong(
    control_plane: ControlPlane, namespace: str, operators: Any, log_format: str
) -> None:
    cp, ns = control_plane, namespace
    # text by the option, json by the environment variable the chart's logFormat sets the option of.
    op = (operators("--allow-local-provider", "--log-format", "text") if log_format == "text"
          else operators("--allow-local-provider", env={"DSB_LOG_FORMAT": "json"}))
    cp.kubectl("apply", "-n", ns, "-f", str(HELLO))
    cp.apply(manifest("lossy", toolCalls=LOSSY_CALLS, snapshotEveryNCalls=2, injectLossAfterNCalls=3), "-n", ns)
    wait_condition(cp, ns, "hello", "Succeeded", timeout=120)
    wait_condition(cp, ns, "lossy", "Succeeded", timeout=120)
    text = op.check_log()  # stopped with SIGTERM; no traceback, no ERROR

    if log_format == "json":
        lines = [line for line in text.splitlines() if line.strip()]
        docs = [json.loads(line) for line in lines]  # every line is one JSON object
        assert all({"time", "level", "logger", "message"} <= doc.keys() for doc in docs), docs
        steps = [d for d in docs if d["logger"] == "durable_sandbox.kube.lifecycle"]
        assert steps and all(d["namespace"] == ns and d["workflow"] in ("hello", "lossy")
                             and d["run"].startswith(d["workflow"] + "-") and d["level"] == "INFO" for d in steps), steps
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", d["time"]) for d in docs)
    else:
        assert all(r["level"] != "?" for r in log_records(text)), text  # no line outside a record

    hello = lifecycle(text, ns, "hello")
    one(hello, r"^admitted: run created \(4 tool call\(s\), provider local\)$")
    one(hello, r"^started$")
    one(hello, r"^Provisioned: sandbox \S+ provisioned")
    assert [line for line in hello if line.startswith("SnapshotTaken: snapshot ")], hello
    finished = one(hello, r"^finished: ")
    assert re.match(r"^finished: Succeeded after \d+\.\ds \(attempt 1\): run hello-\w+ succeeded \(4/4 calls\)$",
                    finished), finished
    # In the order they happened, and nothing said twice.
    assert hello.index(one(hello, "^admitted")) < hello.index("started") < hello.index(finished) == len(hello) - 1
    assert len(hello) == len(set(hello)), hello

    lossy = lifecycle(text, ns, "lossy")
    one(lossy, r"^SandboxLost: sandbox \S+ lost; recovering$")
    one(lossy, r"^Recovered: recovered into sandbox \S+ from ")
    one(lossy, r"^finished: Succeeded after ")


@pytest.mark.timeout(240)
def test_api_server_away_is_one_warning_with_its_next_try_then_back(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    """The API server killed under a running operator: one WARNING saying it does not answer and when the
    operator asks again (kopf's watches retrying printed an ERROR every few seconds, for ever), one INFO once
    it answers again; a Workflow applied after runs."""
    cp, ns = control_plane, namespace
    api = RestartableAPIServer(cp, tmp_path / "apiserver")
    api.start()
    try:
        cp.apply(manifest("before"), "-n", ns)
        op = operators("--allow-local-provider", env={"KUBECONFIG": str(api.kubeconfig)})
        wait_condition(cp, ns, "before", "Succeeded", timeout=90)
        api.kill()
        wait_until(lambda: "the API server does not answer" in op.logs(), 60, "the operator to say the API server is away")
        # The outage lasts OUTAGE seconds (what is simulated, not a wait for something): kopf's watches retry at
        # 1, 1, 2, 3, 5 s meanwhile, each retry an ERROR line before, and the probe asks again at 1, 2, 4 s.
        time.sleep(OUTAGE)
        api.launch()
        api.wait_ready()
        wait_until(lambda: "the API server answers again" in op.logs(), 90, "the operator to say it answers again")
        cp.apply(manifest("after"), "-n", ns)
        wait_condition(cp, ns, "after", "Succeeded", timeout=90)
        text = op.check_log()
    finally:
        api.stop()
    away = [r for r in log_records(text) if "the API server does not answer" in r["message"]]
    assert len(away) == 1 and away[0]["level"] == "WARNING", away
    assert re.search(r"asks again in \d+s, then with a backoff of up to 30s", away[0]["message"]), away
    assert "Request attempt" not in text



@pytest.mark.parametrize(
    ("env", "level", "says"),
    [({}, "WARNING", "no NetworkPolicy of this installation limits the egress of sandbox Pods"),
     ({"DSB_K8S_EGRESS_POLICY": "dsb-durable-sandbox-sandboxes"}, "INFO",
      "NetworkPolicy dsb-durable-sandbox-sandboxes in each watched namespace limits the egress of sandbox Pods")],
    ids=["no-policy", "the-charts-policy"],
)
def test_the_start_log_says_what_limits_sandbox_egress(control_plane: ControlPlane, operators: Any,
                                                       env: dict[str, str], level: str, says: str) -> None:
    """Issue 32 item 7: an operator whose kubernetes provider is usable says at start which NetworkPolicy limits the
    sandbox Pods' egress (the chart's, named in DSB_K8S_EGRESS_POLICY) and that it needs an enforcer, or warns that
    none does."""
    op = operators(env=env)
    wait_until(lambda: "serving Workflows" in op.logs(), 90, "the operator to start")
    records = [r for r in log_records(op.check_log()) if "egress of sandbox Pods" in r["message"]]
    assert [r["level"] for r in records] == [level] and says in records[0]["message"], records
