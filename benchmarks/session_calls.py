"""A Sandbox's session calls (issue 35) through the call API, beside the same call through the provider directly,
and Kubernetes API writes per session call.

    python benchmarks/session_calls.py                     # writes benchmarks/results/session_calls.json
    python benchmarks/session_calls.py --calls 50

What runs: the e2e tier's control plane (scripts/controlplane-build), the CRDs, and `dsb operator
--allow-local-provider --session-port` as a separate process serving one fresh namespace with one local Sandbox. A
ServiceAccount granted `create sandboxes/calls` calls it with durable_sandbox.client, one no-op call at a time
(`write_file` of one byte: the local provider's cheapest call), each journaled in the Sandbox's call journal in
the API server; then the same number of the same calls go to the local provider's `execute` on the Sandbox's live
sandbox from this process, with nothing journaled: the ratio of the two per-call times is what the session (auth,
holder, lease, journal) costs. API writes per call are the API server's own counter (``apiserver_request_total``),
the delta over the session phase minus the cluster's idle writes (see operator_throughput.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, machine_info, print_table, ratio, run_in_workdir, stop_process
from operator_throughput import BIN, ROOT, control_plane, kubectl, minus_f, split_seconds, write_counts

IDLE_S = 10.0
TARGET_RATIO = 1.3  # issue 35's goal for a no-op call through the API against the provider directly (on the node)
TARGET_WRITES_PER_CALL = 1.2  # issue 35's goal with the API-server journal
CALLER_ROLE = """{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "calls"},
 "rules": [{"apiGroups": ["durable-sandbox.dev"], "resources": ["sandboxes/calls"], "verbs": ["create"]}]}"""


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer in {timeout:.0f}s") from None
            time.sleep(0.2)


def ready_sandbox(kubeconfig: str, namespace: str) -> str:
    sandbox = ('{"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "bench"}, '
               '"spec": {"provider": "local"}}')
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", input=sandbox)
    kubectl(kubeconfig, "wait", "--for=condition=Ready", "dsbx/bench", "-n", namespace, "--timeout=120s")
    return kubectl(kubeconfig, "get", "dsbx", "bench", "-n", namespace, "-o", "jsonpath={.status.providerId}")


def caller_token(kubeconfig: str, namespace: str) -> str:
    kubectl(kubeconfig, "create", "serviceaccount", "agent", "-n", namespace)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", input=CALLER_ROLE)
    kubectl(kubeconfig, "create", "rolebinding", "calls", "--role=calls", f"--serviceaccount={namespace}:agent",
            "-n", namespace)
    return kubectl(kubeconfig, "create", "token", "agent", "-n", namespace, "--duration=1h").strip()


def through_api(url: str, namespace: str, token: str, calls: int, prefix: str) -> list[float]:
    from durable_sandbox.client import SandboxClient

    seconds = []
    with SandboxClient.attach("bench", namespace=namespace, url=url, token=token) as box:
        for i in range(calls):
            started = time.perf_counter()
            box.write_file(f"{prefix}/{i}.txt", "x", operation_id=f"{prefix}-{i}")
            seconds.append(time.perf_counter() - started)
    return seconds


def through_provider(home: Path, sandbox_id: str, calls: int) -> list[float]:
    from durable_sandbox.providers.contract import SandboxHandle, ToolCall
    from durable_sandbox.providers.local import LocalProvider

    async def go() -> list[float]:
        provider = LocalProvider(home)
        handle = SandboxHandle(id=sandbox_id, provider="local")
        seconds = []
        for i in range(calls):
            started = time.perf_counter()
            await provider.execute(handle, ToolCall(operation_id=f"direct-{i}", type="write_file",
                                                    args={"path": f"direct/{i}.txt", "contents": "x"}))
            seconds.append(time.perf_counter() - started)
        return seconds

    return asyncio.run(go())


def timing(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"mean": statistics.fmean(ordered), "p50": ordered[len(ordered) // 2],
            "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    with control_plane(args.kubeconfig, workdir) as kubeconfig:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/sandboxes.durable-sandbox.dev", "--timeout=60s")
        namespace, port, home = f"bench-sessions-{os.getpid()}", free_port(), workdir / "operator-home"
        home.mkdir()
        kubectl(kubeconfig, "create", "namespace", namespace)
        env = {**os.environ, "KUBECONFIG": kubeconfig, "DURABLE_SANDBOX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        log = (workdir / "operator.log").open("wb")
        operator = subprocess.Popen([args.dsb, "operator", "--allow-local-provider", "-n", namespace, "--session-port",
                                     str(port), "--session-host", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/healthz", 120)
            sandbox_id = ready_sandbox(kubeconfig, namespace)
            token = caller_token(kubeconfig, namespace)
            through_api(url, namespace, token, 5, "warmup")  # not measured: first connections, the journal made
            before = write_counts(kubeconfig)
            time.sleep(IDLE_S)
            idle, _ = split_seconds(minus_f(write_counts(kubeconfig), before))
            before = write_counts(kubeconfig)
            started = time.perf_counter()
            api = through_api(url, namespace, token, args.calls, "api")
            elapsed = time.perf_counter() - started
            writes, ms = split_seconds(minus_f(write_counts(kubeconfig), before))
            own = {k: v - idle.get(k, 0) / IDLE_S * elapsed for k, v in writes.items()}
            direct = through_provider(home, sandbox_id, args.calls)
        finally:
            stop_process(operator)
            log.close()
    res["api"] = {**timing(api), "calls_per_s": args.calls / elapsed}
    res["direct"] = timing(direct)
    res["ratio_mean"] = ratio(res["api"]["mean"], res["direct"]["mean"])
    res["writes"] = {k: round(v, 1) for k, v in sorted(own.items()) if round(v, 1) > 0}
    res["write_ms"] = {k: round(v, 2) for k, v in sorted(ms.items())}
    res["writes_per_call"] = sum(res["writes"].values()) / args.calls
    res["targets"] = {"ratio": TARGET_RATIO, "met_ratio": (res["ratio_mean"] or 1e9) <= TARGET_RATIO,
                      "writes_per_call": TARGET_WRITES_PER_CALL,
                      "met_writes": res["writes_per_call"] <= TARGET_WRITES_PER_CALL}
    return res


def report(res: dict[str, Any]) -> None:
    print_table("a no-op session call (write_file of 1 byte), one at a time", ["path", "mean ms", "p50 ms", "p95 ms"], [
        [name, fmt(res[name]["mean"] * 1000, digits=2), fmt(res[name]["p50"] * 1000, digits=2),
         fmt(res[name]["p95"] * 1000, digits=2)] for name in ("api", "direct")])
    print(f"through the API / the provider directly: {fmt(res['ratio_mean'], 'x', 2)} (goal <= {TARGET_RATIO}x); "
          f"{fmt(res['api']['calls_per_s'])} calls/s; API writes per call {fmt(res['writes_per_call'], '', 2)} "
          f"(goal <= {TARGET_WRITES_PER_CALL}): {res['writes']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="session calls (and direct calls) measured")
    parser.add_argument("--kubeconfig", help="use this running cluster (cluster-admin) instead of starting one")
    parser.add_argument("--dsb", default=str(BIN / "dsb"), help="the dsb executable")
    parser.add_argument("--tmp", help="where the temp files go")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "session_calls.json")
    args = parser.parse_args()
    run_in_workdir("sessions", args.tmp, lambda workdir: run(args, workdir), report, args.out)


if __name__ == "__main__":
    main()
