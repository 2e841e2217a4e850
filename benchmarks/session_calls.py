"""A Sandbox's session calls (issue 35) through the call API, beside the same call through the provider directly,
and Kubernetes API writes per session call.

    python benchmarks/session_calls.py                     # writes benchmarks/results/session_calls.json
    python benchmarks/session_calls.py --calls 50
    python benchmarks/session_calls.py --node       # the kubernetes provider on the test node: session_calls_node.json

What runs: the e2e tier's control plane (scripts/controlplane-build), the CRDs, and `dsb operator
--allow-local-provider --session-port` as a separate process serving one fresh namespace with ``--sessions`` local
Sandboxes. A ServiceAccount granted `create sandboxes/calls` calls the first with durable_sandbox.client, one no-op
call at a time (`write_file` of one byte: the local provider's cheapest call), each journaled in the Sandbox's call
journal; then the same number of the same calls go to the local provider's `execute` on the Sandbox's live sandbox
from this process, with nothing journaled: the ratio of the two per-call times is what the session (auth, holder,
lease, journal) costs. Then ``--sessions`` clients at once, each ``--calls-each`` calls to a Sandbox of its own.
All of it twice: the operator with the API-server journal, then one with a PostgreSQL journal of the run's own
(``--no-postgres``: the first only). API writes per call are the API server's own counter
(``apiserver_request_total``), the delta over the phase minus the cluster's idle writes (see operator_throughput.py).

``--node``: the same on the test node (tests/e2e/node_support.py: the machine-wide node lock, the node's control
plane, the busybox test image imported), with ``kubernetes`` Sandboxes (real Pods) and a no-op ``shell`` call
(``true``): one call through the call API, then the same call through a ``KubernetesProvider`` of this process on a
Pod of the same template it provisioned in the same namespace, taking turns (interleaved), so a load change hits
both alike; the ratio is of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.ports

from tests.ports import free_port

from _common import RESULTS_DIR, fmt, machine_info, print_table, ratio, run_in_workdir, stop_process
from operator_throughput import (
    BIN,
    ROOT,
    control_plane,
    kubectl,
    minus_f,
    postgres_journal,
    split_seconds,
    write_counts,
)

IDLE_S = 10.0
TARGET_RATIO = 1.3  # issue 35's goal for a no-op call through the API against the provider directly (on the node)
TARGET_WRITES_PER_CALL = 1.2  # issue 35's goal with the API-server journal
PG_TARGET_WRITES_PER_CALL = 0.1  # and with the PostgreSQL journal
# On the node the provider-direct calls of the interleaved phase (and their Pod) are this process's, not the session's.
NOT_THE_SESSIONS = frozenset({"POST pods", "DELETE pods", "POST pods/exec", "CONNECT pods/exec"})
# 21 Pods on a 2-core node: the template's default request (100m each) would not fit them.
SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
HOLD_S = 5.0  # the operator's --session-hold-seconds (its default)
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


def ready_sandboxes(kubeconfig: str, namespace: str, count: int, provider: str = "local") -> list[str]:
    """Sandboxes bench-0 .. bench-<count-1> (of ``provider``), Ready; their live sandboxes' ids."""
    names = [f"bench-{i}" for i in range(count)]
    docs = "\n---\n".join(json.dumps({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox",
                                        "metadata": {"name": name}, "spec": {"provider": provider}}) for name in names)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", input=docs)
    kubectl(kubeconfig, "wait", "--for=condition=Ready", *[f"dsbx/{n}" for n in names], "-n", namespace,
            "--timeout=300s")
    return [kubectl(kubeconfig, "get", "dsbx", n, "-n", namespace, "-o", "jsonpath={.status.providerId}") for n in names]


def caller_token(kubeconfig: str, namespace: str) -> str:
    kubectl(kubeconfig, "create", "serviceaccount", "agent", "-n", namespace)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", input=CALLER_ROLE)
    kubectl(kubeconfig, "create", "rolebinding", "calls", "--role=calls", f"--serviceaccount={namespace}:agent",
            "-n", namespace)
    return kubectl(kubeconfig, "create", "token", "agent", "-n", namespace, "--duration=1h").strip()


def through_api(url: str, namespace: str, token: str, calls: int, prefix: str, name: str = "bench-0",
                node: bool = False) -> list[float]:
    from durable_sandbox.client import SandboxClient

    seconds = []
    with SandboxClient.attach(name, namespace=namespace, url=url, token=token) as box:
        for i in range(calls):
            started = time.perf_counter()
            if node:
                answer = box.run("true", operation_id=f"{prefix}-{i}")
                assert answer.exit_code == 0, answer
            else:
                box.write_file(f"{prefix}/{i}.txt", "x", operation_id=f"{prefix}-{i}")
            seconds.append(time.perf_counter() - started)
    return seconds


def many_sessions(url: str, namespace: str, token: str, sessions: int, calls_each: int, prefix: str = "many",
                  node: bool = False) -> list[float]:
    """``sessions`` clients at once, each ``calls_each`` calls one at a time to a Sandbox of its own."""
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        futures = [pool.submit(through_api, url, namespace, token, calls_each, prefix, f"bench-{i}", node)
                   for i in range(sessions)]
        return [t for f in futures for t in f.result()]


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


class DirectPod:
    """A Pod of the Sandboxes' template in their namespace, provisioned by a KubernetesProvider of this process
    (before the measured phases: its creation's writes are not a session's), for the same no-op call taken in
    turns with the call API's."""

    def __init__(self, namespace: str, kubeconfig: str, image: str) -> None:
        from durable_sandbox.providers.contract import SandboxSpec
        from durable_sandbox.providers.kubernetes import KubernetesProvider
        from durable_sandbox.providers.kubernetes_template import PodTemplate

        self.runner = asyncio.Runner()
        self.provider = KubernetesProvider(namespace=namespace, kubeconfig=kubeconfig, environ={},
                                           template=PodTemplate(image=image, imagePullPolicy="Never",
                                                                resources=SMALL))
        self.handle = self.runner.run(self.provider.provision(SandboxSpec(owner=f"{namespace}/direct"),
                                                              lease_seconds=3600))

    def interleaved(self, url: str, namespace: str, token: str, calls: int) -> tuple[list[float], list[float]]:
        """``calls`` no-op shell calls (``true``) to Sandbox bench-0 through the call API, each followed by the
        same call through the provider on this Pod: (through the API, directly) seconds."""
        from durable_sandbox.client import AsyncSandboxClient
        from durable_sandbox.providers.contract import ToolCall

        async def go() -> tuple[list[float], list[float]]:
            box = AsyncSandboxClient.attach("bench-0", namespace=namespace, url=url, token=token)
            try:
                async def api(i: int) -> None:
                    answer = await box.run("true", operation_id=f"api-{i}")
                    assert answer.exit_code == 0, answer

                async def direct(i: int) -> None:
                    result = await self.provider.execute(self.handle, ToolCall(
                        operation_id=f"direct-{i}", type="shell", args={"command": "true"}))
                    assert result.exit_code == 0, result

                await api(-1)  # warm-up: this client's connection, the session's hold, the provider's connection
                await direct(-1)
                samples: tuple[list[float], list[float]] = ([], [])
                for i in range(calls):
                    for fn, into in ((api, samples[0]), (direct, samples[1])):
                        started = time.perf_counter()
                        await fn(i)
                        into.append(time.perf_counter() - started)
                return samples
            finally:
                await box.aclose()

        return self.runner.run(go())

    def close(self) -> None:
        try:
            self.runner.run(self.provider.destroy(self.handle))
            self.runner.run(self.provider.aclose())
        finally:
            self.runner.close()


def timing(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"mean": statistics.fmean(ordered), "p50": ordered[len(ordered) // 2],
            "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]}


class Writes:
    """API writes over a phase, less the cluster's own idle writes over the same time."""

    def __init__(self, kubeconfig: str, idle: dict[str, float]) -> None:
        self.kubeconfig, self.idle = kubeconfig, idle

    def __enter__(self) -> Writes:
        self.before, self.started = write_counts(self.kubeconfig), time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.elapsed = time.perf_counter() - self.started
        writes, self.ms = split_seconds(minus_f(write_counts(self.kubeconfig), self.before))
        own = {k: v - self.idle.get(k, 0) / IDLE_S * self.elapsed for k, v in writes.items()}
        self.own = {k: round(v, 1) for k, v in sorted(own.items()) if round(v, 1) > 0}


def journal_phases(args: argparse.Namespace, kubeconfig: str, workdir: Path, label: str,
                   extra_env: dict[str, str]) -> dict[str, Any]:
    """One operator (with this journal) in a fresh namespace: one session's calls one at a time beside the same
    calls through the provider, then ``--sessions`` sessions at once."""
    namespace, port, home = f"bench-sessions-{label}-{os.getpid()}", free_port(), workdir / f"operator-home-{label}"
    home.mkdir()
    kubectl(kubeconfig, "create", "namespace", namespace)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "DURABLE_SANDBOX_HOME": str(home), "PYTHONUNBUFFERED": "1",
           **extra_env}
    if args.node:  # the kubernetes provider's Pods, of the test image on the node, in this namespace
        env |= {"DSB_K8S_NAMESPACES": namespace, "DSB_K8S_NAMESPACE": namespace,
                "DSB_K8S_TEMPLATE": json.dumps({"image": args.image, "imagePullPolicy": "Never", "resources": SMALL})}
    log = (workdir / f"operator-{label}.log").open("wb")
    operator = subprocess.Popen([args.dsb, "operator", "--allow-local-provider", "-n", namespace, "--session-port",
                                 str(port), "--session-host", "127.0.0.1", "--session-hold-seconds", str(HOLD_S),
                                 "--session-max-calls-per-second", "100000"],  # one caller for every session here
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    res: dict[str, Any] = {}
    stack = contextlib.ExitStack()  # the provider-direct Pod on the node
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", 120)
        sandbox_ids = ready_sandboxes(kubeconfig, namespace, args.sessions, "kubernetes" if args.node else "local")
        if args.node:
            pod = DirectPod(namespace, kubeconfig, args.image)
            stack.callback(pod.close)
        token = caller_token(kubeconfig, namespace)
        # Not measured: first connections, each Sandbox's call journal made (once in its life) and its attach record.
        many_sessions(url, namespace, token, args.sessions, 1, "warm", args.node)
        time.sleep(HOLD_S + 2)  # the warm-up's sessions let go (their releases are not the idle window's writes)
        before = write_counts(kubeconfig)
        time.sleep(IDLE_S)
        idle, _ = split_seconds(minus_f(write_counts(kubeconfig), before))
        with Writes(kubeconfig, idle) as one:
            if args.node:
                api, direct = pod.interleaved(url, namespace, token, args.calls)
            else:
                api = through_api(url, namespace, token, args.calls, "api")
        if not args.node:
            direct = through_provider(home, sandbox_ids[0], args.calls)
        time.sleep(HOLD_S + 2)
        with Writes(kubeconfig, idle) as many:
            spread = many_sessions(url, namespace, token, args.sessions, args.calls_each, "many", args.node)
    finally:
        stack.close()
        stop_process(operator)
        log.close()
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(workdir / f"operator-{label}.log", args.keep_logs)
    total = args.sessions * args.calls_each
    res["api"] = {**timing(api), "calls_per_s": args.calls / sum(api)}  # the calls' own time (interleaved on the node)
    res["direct"] = timing(direct)
    res["ratio_mean"] = ratio(res["api"]["mean"], res["direct"]["mean"])
    res["ratio_p50"] = ratio(res["api"]["p50"], res["direct"]["p50"])
    res["writes"], res["write_ms"] = one.own, {k: round(v, 2) for k, v in sorted(one.ms.items())}
    res["writes_per_call"] = sum(v for k, v in one.own.items() if k not in NOT_THE_SESSIONS) / args.calls
    res["many"] = {**timing(spread), "calls": total, "calls_per_s": total / many.elapsed, "writes": many.own,
                   "writes_per_call": sum(many.own.values()) / total}
    return res


@contextlib.contextmanager
def node_control_plane(workdir: Path, image: str) -> Iterator[str]:
    """The test node's control plane (a Ready node: Pods run), under the machine-wide node lock, with the busybox
    test image imported (tests/e2e/node_support.py); its cluster-admin kubeconfig."""
    from tests.e2e.controlplane import build_controlplane, stop_control_plane
    from tests.e2e.node_support import BUSYBOX, busybox_image, node_lock, prepare_node, start_node_cluster

    binary = build_controlplane()
    pause, _gvisor = prepare_node()
    (workdir / "node").mkdir()
    with node_lock() as fd:
        cluster = start_node_cluster(binary, workdir / "node", pause, fd)
        try:
            if image == BUSYBOX:
                busybox_image(cluster)
            yield str(cluster.kubeconfig)
        finally:
            stop_control_plane(cluster.process)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    cluster = node_control_plane(workdir, args.image) if args.node else control_plane(args.kubeconfig, workdir)
    with cluster as kubeconfig, postgres_journal(workdir, args.postgres) as dsn:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/sandboxes.durable-sandbox.dev", "--timeout=60s")
        res.update(journal_phases(args, kubeconfig, workdir, "apiserver", {}))
        if dsn is not None:
            res["postgres"] = journal_phases(args, kubeconfig, workdir, "postgres",
                                             {"DSB_OPERATOR_JOURNAL": f"{dsn}?schema=bench"})
    met = [res, *([res["postgres"]] if "postgres" in res else [])]
    res["targets"] = {"ratio": TARGET_RATIO, "met_ratio": all((r["ratio_p50"] or 1e9) <= TARGET_RATIO for r in met),
                      "writes_per_call": TARGET_WRITES_PER_CALL,
                      "met_writes": max(res["writes_per_call"], res["many"]["writes_per_call"]) <= TARGET_WRITES_PER_CALL}
    if "postgres" in res:
        pg = res["postgres"]
        res["targets"].update(pg_writes_per_call=PG_TARGET_WRITES_PER_CALL, met_pg_writes=max(
            pg["writes_per_call"], pg["many"]["writes_per_call"]) <= PG_TARGET_WRITES_PER_CALL)
    return res


def report(res: dict[str, Any]) -> None:
    journals = [("API server", res), *([("PostgreSQL", res["postgres"])] if "postgres" in res else [])]
    print_table("a no-op session call (write_file of 1 byte; on the node: shell `true`), one at a time", ["journal", "path", "mean ms", "p50 ms",
                                                                               "p95 ms"], [
        [label, name, fmt(r[name]["mean"] * 1000, digits=2), fmt(r[name]["p50"] * 1000, digits=2),
         fmt(r[name]["p95"] * 1000, digits=2)] for label, r in journals for name in ("api", "direct")])
    for label, r in journals:
        print(f"{label}: through the API / the provider directly: {fmt(r['ratio_p50'], 'x', 2)} (medians; means "
              f"{fmt(r['ratio_mean'], 'x', 2)}; goal <= "
              f"{TARGET_RATIO}x); one session {fmt(r['api']['calls_per_s'])} calls/s, API writes per call "
              f"{fmt(r['writes_per_call'], '', 2)}: {r['writes']}")
        m = r["many"]
        print(f"{label}: {res['args']['sessions']} sessions at once: {fmt(m['calls_per_s'])} calls/s, p50 "
              f"{fmt(m['p50'] * 1000, digits=1)} ms, API writes per call {fmt(m['writes_per_call'], '', 2)}: {m['writes']}")
    print(f"goals: API writes per call <= {TARGET_WRITES_PER_CALL} (API server), <= {PG_TARGET_WRITES_PER_CALL} "
          f"(PostgreSQL); {res['targets']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="one session's calls (and direct calls) measured")
    parser.add_argument("--sessions", type=int, default=20, help="sessions at once (a Sandbox each)")
    parser.add_argument("--calls-each", type=int, default=50, help="calls of each of --sessions")
    parser.add_argument("--no-postgres", dest="postgres", action="store_false",
                        help="measure the API-server journal only (not also the operator with a PostgreSQL journal)")
    parser.add_argument("--kubeconfig", help="use this running cluster (cluster-admin) instead of starting one")
    parser.add_argument("--node", action="store_true", help="on the test node with the kubernetes provider (real Pods)")
    parser.add_argument("--image", default="localhost/busybox:dsb-test",
                        help="the sandbox Pods' image with --node (tests/e2e/node_support.py builds and imports the "
                             "default; another must be on the node)")
    parser.add_argument("--dsb", default=str(BIN / "dsb"), help="the dsb executable")
    parser.add_argument("--tmp", help="where the temp files go")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep-logs", type=Path, help="copy the operators' logs into this directory")
    args = parser.parse_args()
    args.out = args.out or RESULTS_DIR / ("session_calls_node.json" if args.node else "session_calls.json")
    run_in_workdir("sessions", args.tmp, lambda workdir: run(args, workdir), report, args.out)


if __name__ == "__main__":
    main()
