"""What one operator replica costs with thousands of Workflows waiting on a signal, and how much faster two
replicas finish a batch than one.

    python benchmarks/operator_scale.py                        # writes benchmarks/results/operator_scale.json
    python benchmarks/operator_scale.py --idle 100,1000 --batch 200
    python benchmarks/operator_scale.py --idle '' --batch 200  # only the replicas' batch
    python benchmarks/operator_scale.py --kubeconfig .dev-cluster/kubeconfig   # an already running cluster

What runs: a real kube-apiserver + etcd (the e2e tier's control plane, built by scripts/controlplane-build,
unless --kubeconfig names a cluster), the CRDs from crds/, and `dsb operator` as separate processes, each
serving one fresh namespace per phase.

**Idle cost.** Workflows running ``examples.flows.approval_gate`` (a sandbox call, then a wait on the
``approve`` callback with the sandbox hibernated) are added until 100, 1,000, 2,000 wait. At each level,
after every one shows ``WaitingForSignal`` and the replica has parked them all: its RSS (``VmRSS`` of
/proc/<pid>/status), its CPU over an idle window (utime+stime of /proc/<pid>/stat), its asyncio tasks and
parked runs (its /metrics), and the live sandboxes in the local provider's inventory (must be 0). Then the
replica is restarted (SIGTERM, new process) and the time until it has looked at every Workflow again and
parked it is measured (the backlog reconcile), and last every Workflow is signalled and the time until all
have Succeeded is measured; each call's execution is counted in a side-effect log (exactly twice per
Workflow: before and after the approval).

**Replicas.** A batch of short Workflows (one shell call each, appending its name to a side-effect log) is
applied at once, first with one replica, then (in a fresh namespace) with two; timed from the apply until
the last one Succeeded. The ratio is one replica's time over two replicas' time; the side-effect log must
name every Workflow exactly once in each phase, and each replica's share is reported.

The machine's load average is recorded next to every figure: on a shared 2-core machine the figures move
with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.ports

from tests.ports import free_port

from _common import fmt, machine_info, print_table, ratio, run_in_workdir
from operator_throughput import RESULTS_DIR, control_plane, kubectl

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POLL_S = 1.0
GATE = "examples.flows.approval_gate:approval_gate"
PAGE = 500  # Workflows applied / listed per request


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------------------------------- a replica


@dataclass
class Replica:
    """One `dsb operator` process serving ``namespace``, with its metrics on a free local port."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @classmethod
    def start(cls, dsb: str, kubeconfig: str, namespace: str, home: Path, workdir: Path, name: str,
              lease_seconds: float) -> Replica:
        port = free_port()
        log = workdir / f"{name}.log"
        env = {**os.environ, "KUBECONFIG": kubeconfig, "DURABLE_SANDBOX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        command = [dsb, "operator", "--allow-local-provider", "--workflows", "examples.flows", "-n", namespace,
                   "--worker-id", name, "--lease-seconds", str(lease_seconds),
                   "--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
        with log.open("ab") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
                                    start_new_session=True)
        return cls(name, proc, port, log)

    def metrics(self) -> dict[str, float]:
        """Our gauges from /metrics (``name{labels}`` -> value)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^(durable_sandbox_(?:event_loop_tasks|runs)(?:\{[^}]*\})?) (\S+)$", line)
            if m:
                out[m[1]] = float(m[2])
        return out

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self.process.pid}")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 120) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)


# ------------------------------------------------------------------------------------------- the cluster side


def gate(name: str, effects: Path) -> dict[str, Any]:
    return {
        "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
        "spec": {"entrypoint": GATE, "input": {"name": name, "effects": str(effects), "hibernateAfterSeconds": 0}},
    }  # fmt: skip


def short(name: str, effects: Path) -> dict[str, Any]:
    return {
        "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
        "spec": {"sandbox": {"provider": "local"},
                 "toolCalls": [{"type": "shell", "operationId": "effect", "command": f"echo {name} >> {effects}"}]},
    }  # fmt: skip


def apply(kubeconfig: str, namespace: str, docs: list[dict[str, Any]]) -> None:
    for i in range(0, len(docs), PAGE):
        kubectl(kubeconfig, "apply", "--server-side", "-n", namespace, "-f", "-",
                input=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": docs[i:i + PAGE]}))


async def _phases(kubeconfig: str, namespace: str) -> dict[str, dict[str, bool | str]]:
    """Each Workflow's conditions (True or not) by name, and its status message under "message"."""
    from durable_sandbox.kube.api.client import KubeClient
    from durable_sandbox.kube.spec.workflows import WorkflowClient

    api = await KubeClient.connect(kubeconfig=kubeconfig)
    try:
        out: dict[str, dict[str, bool | str]] = {}
        for obj in await WorkflowClient(api, namespace).list():
            status = obj.get("status") or {}
            conds: dict[str, bool | str] = {c["type"]: c.get("status") == "True" for c in status.get("conditions") or []}
            error = status.get("error") or {}
            conds["message"] = f"{error.get('type')}: {error.get('message')}" if error else ""
            out[obj["metadata"]["name"]] = conds
        return out
    finally:
        await api.close()


def wait_all(kubeconfig: str, namespace: str, names: set[str], condition: str, timeout: float) -> float:
    """Seconds until every Workflow in ``names`` has ``condition`` True (raises on Failed, or after timeout)."""
    t0 = time.monotonic()
    while True:
        seen = asyncio.run(_phases(kubeconfig, namespace))
        failed = [n for n in names if seen.get(n, {}).get("Failed")]
        if failed:
            why = "; ".join(f"{n}: {seen[n]['message']}" for n in sorted(failed)[:3])
            raise RuntimeError(f"{len(failed)} Workflow(s) failed, e.g. {why}")
        missing = [n for n in names if not seen.get(n, {}).get(condition)]
        if not missing:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{len(missing)} Workflow(s) without {condition} after {timeout:.0f}s, e.g. {missing[:3]}")
        time.sleep(POLL_S)


async def _signal_all(kubeconfig: str, namespace: str, names: list[str]) -> None:
    from durable_sandbox.kube.api.client import KubeClient
    from durable_sandbox.kube.spec.workflows import WorkflowClient

    api = await KubeClient.connect(kubeconfig=kubeconfig)
    try:
        client = WorkflowClient(api, namespace)
        gate_ = asyncio.Semaphore(20)

        async def one(name: str) -> None:
            async with gate_:
                await client.signal(name, "approve", True)

        await asyncio.gather(*(one(n) for n in names))
    finally:
        await api.close()


def wait_parked(replica: Replica, count: int, timeout: float) -> float:
    """Seconds until ``replica`` reports ``count`` parked runs and none active."""
    t0 = time.monotonic()
    while True:
        if not replica.alive():
            raise RuntimeError(f"{replica.name} exited ({replica.process.returncode}); see {replica.log}")
        with contextlib.suppress(OSError):
            m = replica.metrics()
            if m.get('durable_sandbox_runs{state="parked"}', 0) >= count and m.get('durable_sandbox_runs{state="active"}', 0) == 0:
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{replica.name} did not park {count} runs within {timeout:.0f}s: {replica.metrics()}")
        time.sleep(0.5)


def live_sandboxes(home: Path) -> int:
    d = home / "local" / "workspaces"
    return sum(1 for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else 0


def effect_counts(effects: Path) -> Counter[str]:
    return Counter(effects.read_text().splitlines()) if effects.exists() else Counter()


@contextlib.contextmanager
def fresh_namespace(kubeconfig: str, label: str) -> Iterator[str]:
    namespace = f"scale-{label}-{os.getpid()}"
    kubectl(kubeconfig, "create", "namespace", namespace)
    try:
        yield namespace
    finally:
        with contextlib.suppress(RuntimeError):
            kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")


# ------------------------------------------------------------------------------------------- phases


def idle_cost(args: argparse.Namespace, kubeconfig: str, workdir: Path) -> dict[str, Any]:
    levels = sorted(args.idle)
    home, effects = workdir / "idle-home", workdir / "idle-effects.log"
    home.mkdir()
    out: dict[str, Any] = {"levels": []}
    with fresh_namespace(kubeconfig, "idle") as namespace:
        replica = Replica.start(args.dsb, kubeconfig, namespace, home, workdir, "idle-1", args.lease_seconds)
        try:
            wait_parked(replica, 0, 180)
            time.sleep(args.window)  # settle: the empty replica's own baseline
            base_rss = replica.rss_bytes()
            base_tasks = replica.metrics().get("durable_sandbox_event_loop_tasks")
            out["empty"] = {"rss_mib": base_rss / 2**20, "tasks": base_tasks, "load": load()}
            names: list[str] = []
            for level in levels:
                new = [f"gate-{i:05d}" for i in range(len(names), level)]
                t0 = time.monotonic()
                apply(kubeconfig, namespace, [gate(n, effects) for n in new])
                names.extend(new)
                wait_all(kubeconfig, namespace, set(names), "WaitingForSignal", args.timeout)
                wait_parked(replica, level, args.timeout)
                settle = time.monotonic() - t0
                cpu0, w0 = replica.cpu_seconds(), time.monotonic()
                time.sleep(args.window)
                cpu = (replica.cpu_seconds() - cpu0) / (time.monotonic() - w0)
                rss = replica.rss_bytes()
                m = replica.metrics()
                row = {
                    "workflows": level, "rss_mib": rss / 2**20, "idle_cpu_percent": 100 * cpu,
                    "rss_growth_kib_per_workflow": (rss - base_rss) / 1024 / level,
                    "event_loop_tasks": m.get("durable_sandbox_event_loop_tasks"),
                    "parked": m.get('durable_sandbox_runs{state="parked"}'),
                    "live_sandboxes": live_sandboxes(home), "seconds_to_all_waiting": settle, "load": load(),
                }  # fmt: skip
                out["levels"].append(row)
                print(f"  {level} waiting: {row}", flush=True)
            # The backlog after a restart: a new process lists every Workflow and parks each again.
            replica.stop()
            t0 = time.monotonic()
            replica = Replica.start(args.dsb, kubeconfig, namespace, home, workdir, "idle-2", args.lease_seconds)
            wait_parked(replica, len(names), args.timeout)
            out["restart"] = {"workflows": len(names), "seconds_to_reconcile": time.monotonic() - t0,
                              "rss_mib": replica.rss_bytes() / 2**20, "load": load()}
            print(f"  restart: {out['restart']}", flush=True)
            t0 = time.monotonic()
            asyncio.run(_signal_all(kubeconfig, namespace, names))
            wait_all(kubeconfig, namespace, set(names), "Succeeded", args.timeout)
            seconds = time.monotonic() - t0
            counts = effect_counts(effects)
            twice = all(counts[f"prepared {n}"] == 1 and counts[f"applied {n}"] == 1 for n in names)
            out["signalled"] = {"workflows": len(names), "seconds_to_all_succeeded": seconds,
                                "each_call_once": twice, "extra_lines": sum(counts.values()) - 2 * len(names),
                                "live_sandboxes_after": live_sandboxes(home), "load": load()}
            print(f"  signalled: {out['signalled']}", flush=True)
        finally:
            replica.stop()
    return out


def batch(args: argparse.Namespace, kubeconfig: str, workdir: Path, replicas: int) -> dict[str, Any]:
    home, effects = workdir / f"batch{replicas}-home", workdir / f"batch{replicas}-effects.log"
    home.mkdir()
    with fresh_namespace(kubeconfig, f"batch{replicas}") as namespace:
        running = [Replica.start(args.dsb, kubeconfig, namespace, home, workdir, f"b{replicas}-r{i + 1}",
                                 args.lease_seconds) for i in range(replicas)]
        try:
            for r in running:
                wait_parked(r, 0, 180)
            names = [f"short-{i:04d}" for i in range(args.batch)]
            load0 = load()
            t0 = time.monotonic()
            apply(kubeconfig, namespace, [short(n, effects) for n in names])
            wait_all(kubeconfig, namespace, set(names), "Succeeded", args.timeout)
            seconds = time.monotonic() - t0
            counts = effect_counts(effects)
            # Who executed each run: the replica that wrote its Succeeded Event (reportingInstance).
            events = json.loads(kubectl(kubeconfig, "get", "events", "-n", namespace, "-o", "json"))["items"]
            shares = Counter(e.get("reportingInstance") for e in events if e.get("reason") == "Succeeded")
            return {
                "replicas": replicas, "workflows": len(names), "seconds": seconds,
                "workflows_per_s": len(names) / seconds,
                "each_once": all(counts[n] == 1 for n in names) and sum(counts.values()) == len(names),
                "executions": sum(counts.values()), "succeeded_by_replica": dict(shares),
                "load_before": load0, "load_after": load(),
            }  # fmt: skip
        finally:
            for r in running:
                r.stop()


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info(), "args": {k: v for k, v in vars(args).items() if k != "dsb"}}
    with control_plane(args.kubeconfig, workdir) as kubeconfig:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/workflows.durable-sandbox.dev", "--timeout=60s")
        if args.batch:
            res["batch_one"] = batch(args, kubeconfig, workdir, 1)
            print(f"  one replica: {res['batch_one']}", flush=True)
            res["batch_two"] = batch(args, kubeconfig, workdir, 2)
            print(f"  two replicas: {res['batch_two']}", flush=True)
            res["speedup_two_over_one"] = ratio(res["batch_one"]["seconds"], res["batch_two"]["seconds"])
        if args.idle:
            res["idle"] = idle_cost(args, kubeconfig, workdir)
    return res


def report(res: dict[str, Any]) -> None:
    if "idle" in res:
        rows = [[str(r["workflows"]), fmt(r["rss_mib"], " MiB"), fmt(r["rss_growth_kib_per_workflow"], " KiB"),
                 fmt(r["idle_cpu_percent"], " %", 2), str(int(r["event_loop_tasks"] or 0)), str(r["live_sandboxes"]),
                 fmt(r["seconds_to_all_waiting"], " s", 0), " ".join(map(str, r["load"]))]
                for r in res["idle"]["levels"]]
        print_table("one replica with Workflows waiting on a signal",
                    ["waiting", "RSS", "growth/Workflow", "idle CPU", "tasks", "live sandboxes", "apply→parked", "load"],
                    rows)
        for key in ("restart", "signalled"):
            print(f"{key}: {res['idle'].get(key)}")
    if "batch_one" in res:
        rows = [[str(b["replicas"]), str(b["workflows"]), fmt(b["seconds"], " s"), fmt(b["workflows_per_s"], "/s", 2),
                 str(b["each_once"]), " ".join(map(str, b["load_before"]))] for b in (res["batch_one"], res["batch_two"])]
        print_table("a batch of short Workflows", ["replicas", "Workflows", "time", "throughput", "each once", "load"],
                    rows)
        print(f"two replicas vs one: {fmt(res['speedup_two_over_one'], 'x', 2)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=lambda s: [int(x) for x in s.split(",") if x], default=[100, 1000, 2000],
                        help="waiting-Workflow levels, comma-separated ('' skips the idle phase)")
    parser.add_argument("--batch", type=int, default=200, help="short Workflows in the replicas' batch (0 skips it)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of each idle CPU measurement")
    parser.add_argument("--lease-seconds", type=float, default=15.0)
    parser.add_argument("--kubeconfig", help="use this running cluster (cluster-admin) instead of starting one")
    parser.add_argument("--dsb", default=str(BIN / "dsb"), help="the dsb executable")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for each phase")
    parser.add_argument("--tmp", help="where the temp files go")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "operator_scale.json")
    args = parser.parse_args()
    run_in_workdir("scale", args.tmp, lambda workdir: run(args, workdir), report, args.out)


if __name__ == "__main__":
    main()
