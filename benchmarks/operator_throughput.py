"""Tool calls per second through the operator on a local control plane, beside `dsb run` of the same
manifest, and Kubernetes API writes per completed call.

    python benchmarks/operator_throughput.py                  # writes benchmarks/results/operator_throughput.json
    python benchmarks/operator_throughput.py --calls 300 --workflows 20 --calls-each 50
    python benchmarks/operator_throughput.py --kubeconfig .dev-cluster/kubeconfig   # an already running cluster

What runs: a real kube-apiserver + etcd (the e2e tier's control plane, built by scripts/controlplane-build,
unless --kubeconfig names a cluster), the CRDs from crds/, and `dsb operator --allow-local-provider` as a
separate process serving one fresh namespace. A Workflow of N no-op tool calls (`write_file` of one byte:
the local provider's cheapest call, no process spawned) is applied server-side and timed from the apply
until its Succeeded condition; then 20 Workflows at once. `dsb run` of the same manifests on the local
SQLite store runs in the same invocation, for the ratio.

API writes come from the API server's own counter, ``apiserver_request_total`` (GET /metrics with the
cluster-admin kubeconfig), by verb and resource: the delta over each phase, minus what the cluster writes
on its own when idle (controller-manager leader election, ...), measured just before for as long.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile  # noqa: F401  (the operator is profiled in its own process with `python -m cProfile`)
import json
import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, machine_info, print_table, ratio, write_results

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")
# What the operator writes: journal, run and lease objects (the Journal kind), status (and finalizers) of
# Workflows, Events. Writes to anything else during a phase are the cluster's own (namespace cleanup, ...) and are
# reported apart, not counted per call.
OPERATOR_RESOURCES = ("journals", "workflows", "workflows/status", "events")
TARGET_CALLS_PER_S = 100.0
TARGET_WRITES_PER_CALL = 2.0
# With the journal in PostgreSQL (issue 25): half of `dsb run`'s calls/s for one Workflow, 500 calls/s over 20,
# and status only (coalesced) in the API server.
PG_TARGET_RATIO_ONE = 0.5
PG_TARGET_CALLS_PER_S_MANY = 500.0
PG_TARGET_WRITES_PER_CALL = 0.2
POLL_S = 0.5  # how often the benchmark reads the Workflows it waits for (reads are not writes)
IDLE_S = 10.0  # the idle window that measures the cluster's own writes


# ------------------------------------------------------------------------------------------- control plane


@contextlib.contextmanager
def control_plane(kubeconfig: str | None, workdir: Path) -> Iterator[str]:
    """A kubeconfig with cluster-admin credentials: the given one, or a control plane started here."""
    if kubeconfig:
        yield kubeconfig
        return
    build = subprocess.run([str(ROOT / "scripts" / "controlplane-build")], stdout=subprocess.PIPE, text=True, check=True)
    binary = build.stdout.strip().splitlines()[-1]
    ready = workdir / "ready.json"
    log = (workdir / "controlplane.log").open("wb")
    proc = subprocess.Popen([binary, "up", "--dir", str(workdir / "cp"), "--ready-file", str(ready)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the control plane did not start; see {workdir}/controlplane.log")
            time.sleep(0.2)
        yield json.loads(ready.read_text())["kubeconfig"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def kubectl(kubeconfig: str, *args: str, input: str | None = None) -> str:
    exe = str(BIN / "kubectl") if (BIN / "kubectl").exists() else (shutil.which("kubectl") or "kubectl")
    proc = subprocess.run([exe, f"--kubeconfig={kubeconfig}", *args], input=input, capture_output=True, text=True,
                          timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr}")
    return proc.stdout


_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


_DURATION = re.compile(r'^apiserver_request_duration_seconds_(?P<kind>sum|count)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def write_counts(kubeconfig: str) -> dict[str, float]:
    """apiserver_request_total of write verbs, summed by "VERB resource[/subresource]"; plus, under
    "seconds VERB resource", the seconds the API server spent serving them (apiserver_request_duration_seconds)."""
    out: dict[str, float] = defaultdict(float)
    for line in kubectl(kubeconfig, "get", "--raw", "/metrics").splitlines():
        m = _SAMPLE.match(line) or _DURATION.match(line)
        if not m or (m.re is _DURATION and m["kind"] != "sum"):
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        if labels.get("verb") not in WRITE_VERBS:
            continue
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        if m.re is _DURATION:
            out[f"seconds {labels['verb']} {resource}"] += float(m["value"])
        else:
            out[f"{labels['verb']} {resource}"] += float(m["value"])
    return out


def split_seconds(counts: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(write counts, mean milliseconds the API server took per write) from a ``write_counts`` delta."""
    writes = {k: v for k, v in counts.items() if not k.startswith("seconds ")}
    ms = {k: 1000 * counts.get(f"seconds {k}", 0.0) / n for k, n in writes.items() if n}
    return writes, ms


def minus_f(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}


# ------------------------------------------------------------------------------------------- workloads


def manifest(name: str, calls: int) -> dict[str, Any]:
    return {
        "apiVersion": "durable-sandbox.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {
            "sandbox": {"provider": "local"},
            "toolCalls": [{"type": "write_file", "path": f"f{i % 16}.txt", "contents": "x"} for i in range(calls)],
        },
    }


async def wait_succeeded(kubeconfig: str, namespace: str, names: list[str], timeout: float,
                         status_sizes: list[int]) -> None:
    """Until every Workflow has Succeeded; samples each one's .status size (bytes of JSON) on the way."""
    from durable_sandbox.kube.api.client import KubeClient
    from durable_sandbox.kube.spec.workflows import WorkflowClient

    api = await KubeClient.connect(kubeconfig=kubeconfig)
    try:
        client = WorkflowClient(api, namespace)
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending:
            for obj in await client.list():
                if obj["metadata"]["name"] not in pending:
                    continue
                status = obj.get("status") or {}
                status_sizes.append(len(json.dumps(status, separators=(",", ":"))))
                conditions = {c["type"]: c for c in status.get("conditions") or []}
                if conditions.get("Failed", {}).get("status") == "True":
                    raise RuntimeError(f"{obj['metadata']['name']} failed: {conditions['Failed'].get('message')}")
                if conditions.get("Succeeded", {}).get("status") == "True":
                    pending.discard(obj["metadata"]["name"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"not Succeeded after {timeout:.0f}s: {sorted(pending)}")
            await asyncio.sleep(POLL_S)
    finally:
        await api.close()


def through_operator(kubeconfig: str, namespace: str, docs: list[dict[str, Any]], baseline: dict[str, float],
                     timeout: float) -> dict[str, Any]:
    calls = sum(len(d["spec"]["toolCalls"]) for d in docs)
    before = write_counts(kubeconfig)
    sizes: list[int] = []
    t0 = time.perf_counter()
    kubectl(kubeconfig, "apply", "--server-side", "-n", namespace, "-f", "-",
            input=yaml.safe_dump_all(docs))
    asyncio.run(wait_succeeded(kubeconfig, namespace, [d["metadata"]["name"] for d in docs], timeout, sizes))
    seconds = time.perf_counter() - t0
    raw, server_ms = split_seconds(minus_f(write_counts(kubeconfig), before))
    idle = {k: v * seconds for k, v in baseline.items()}
    net = {k: max(0.0, v - idle.get(k, 0.0)) for k, v in raw.items()}
    ours = {k: v for k, v in net.items() if k.split(" ", 1)[1] in OPERATOR_RESOURCES}
    total = sum(ours.values())
    return {
        "workflows": len(docs), "calls": calls, "seconds": seconds, "calls_per_s": calls / seconds,
        "writes": total, "writes_per_call": total / calls,
        "writes_by_resource": dict(sorted(ours.items(), key=lambda kv: -kv[1])),
        "other_writes": {k: v for k, v in net.items() if k not in ours}, "writes_raw": dict(raw), "status_bytes_max": max(sizes, default=0), "status_samples": len(sizes),
        # Mean time the API server took to serve one write, by kind: against seconds/call, how much of a
        # call is the API server's and how much is the operator's own (and the network's).
        "apiserver_ms_per_write": {k: round(v, 2) for k, v in server_ms.items() if k.split(" ", 1)[1] in OPERATOR_RESOURCES},
        "ms_per_call": 1000 * seconds / calls,
    }  # fmt: skip


def through_dsb_run(dsb: str, docs: list[dict[str, Any]], workdir: Path) -> dict[str, Any]:
    calls = sum(len(d["spec"]["toolCalls"]) for d in docs)
    path = workdir / f"local-{len(docs)}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    env = {**os.environ, "DURABLE_SANDBOX_HOME": str(workdir / "local-home")}
    t0 = time.perf_counter()
    proc = subprocess.run([dsb, "run", str(path), "--store", str(workdir / f"local-{len(docs)}.db"), "-o", "json"],
                          capture_output=True, text=True, env=env, timeout=3600, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"dsb run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"workflows": len(docs), "calls": calls, "seconds": seconds, "calls_per_s": calls / seconds}


# ------------------------------------------------------------------------------------------- main


def operator_phases(args: argparse.Namespace, kubeconfig: str, workdir: Path, journal: str,
                    extra_env: dict[str, str]) -> dict[str, Any]:
    """One operator (its journal in ``journal``) serving a fresh namespace: warm-up, the cluster's idle writes,
    one Workflow, then ``--workflows`` at once."""
    res: dict[str, Any] = {}
    namespace = f"bench-{journal}-{os.getpid()}"
    kubectl(kubeconfig, "create", "namespace", namespace)
    home = workdir / f"operator-home-{journal}"
    home.mkdir()
    env = {**os.environ, "KUBECONFIG": kubeconfig, "DURABLE_SANDBOX_HOME": str(home), "PYTHONUNBUFFERED": "1",
           **extra_env}
    command = [args.dsb, "operator", "--allow-local-provider", "-n", namespace]
    profile = workdir / f"operator-{journal}.prof"
    if args.profile:
        command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "durable_sandbox.cli.main",
                   *command[1:]]
    log = (workdir / f"operator-{journal}.log").open("wb")
    operator = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        # Warm-up: the operator is serving once a small Workflow has gone through (not timed).
        asyncio.run(wait_succeeded(kubeconfig, namespace, [_apply(kubeconfig, namespace, manifest("warmup", 10))],
                                   180, []))
        before = write_counts(kubeconfig)
        time.sleep(IDLE_S)  # the cluster's own writes while nothing of ours runs
        idle_writes, _ = split_seconds(minus_f(write_counts(kubeconfig), before))
        baseline = {k: v / IDLE_S for k, v in idle_writes.items()}
        res["idle_writes_per_s"] = baseline
        one = [manifest("one", args.calls)]
        many = [manifest(f"many-{i:02d}", args.calls_each) for i in range(args.workflows)]
        with sampled(operator.pid, workdir / f"one-{journal}.pyspy", enabled=args.py_spy):
            res["operator_one"] = through_operator(kubeconfig, namespace, one, baseline, args.timeout)
        if args.py_spy:
            res["py_spy"] = summarize_samples(workdir / f"one-{journal}.pyspy",
                                              RESULTS_DIR / f"operator_throughput_{journal}_pyspy.txt")
        res["operator_many"] = through_operator(kubeconfig, namespace, many, baseline, args.timeout)
    finally:
        operator.send_signal(signal.SIGTERM)
        try:
            operator.wait(120)
        except subprocess.TimeoutExpired:
            operator.kill()
        log.close()
        with contextlib.suppress(RuntimeError):
            kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")
    if args.profile and profile.exists():
        out = RESULTS_DIR / f"operator_throughput_{journal}_profile.txt"
        with out.open("w") as f:
            pstats.Stats(str(profile), stream=f).sort_stats("cumulative").print_stats(40)
        res["profile"] = str(out.relative_to(ROOT))
    return res


@contextlib.contextmanager
def postgres_journal(workdir: Path, enabled: bool) -> Iterator[str | None]:
    """A PostgreSQL server of this run's own (tests/postgres/server.py, durable: every commit flushed as in
    production) for the operator's journal; None when not measured."""
    if not enabled:
        yield None
        return
    sys.path.insert(0, str(ROOT))
    from tests.postgres.server import PostgresServer

    directory = workdir / "postgres"
    directory.mkdir()
    workdir.chmod(0o711)  # the server runs as the postgres user: it must be able to enter its directory
    server = PostgresServer(directory / "server", durable=True).up()
    try:
        yield server.dsn()
    finally:
        server.down(purge=True)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info(), "args": vars(args)}
    with control_plane(args.kubeconfig, workdir) as kubeconfig, postgres_journal(workdir, args.postgres) as dsn:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/workflows.durable-sandbox.dev", "--timeout=60s")
        res.update(operator_phases(args, kubeconfig, workdir, "apiserver", {}))
        if dsn is not None:
            res["postgres"] = operator_phases(args, kubeconfig, workdir, "postgres",
                                              {"DSB_OPERATOR_JOURNAL": f"{dsn}?schema=bench"})
    one = [manifest("one", args.calls)]
    many = [manifest(f"many-{i:02d}", args.calls_each) for i in range(args.workflows)]
    res["dsb_run_one"] = through_dsb_run(args.dsb, one, workdir)
    res["dsb_run_many"] = through_dsb_run(args.dsb, many, workdir)
    res["ratio_one"] = ratio(res["operator_one"]["calls_per_s"], res["dsb_run_one"]["calls_per_s"])
    res["ratio_many"] = ratio(res["operator_many"]["calls_per_s"], res["dsb_run_many"]["calls_per_s"])
    res["targets"] = {
        "calls_per_s_one": TARGET_CALLS_PER_S, "met_calls_per_s": res["operator_one"]["calls_per_s"] >= TARGET_CALLS_PER_S,
        "writes_per_call": TARGET_WRITES_PER_CALL,
        "met_writes": max(res["operator_one"]["writes_per_call"], res["operator_many"]["writes_per_call"])
        <= TARGET_WRITES_PER_CALL,
    }  # fmt: skip
    if "postgres" in res:
        pg = res["postgres"]
        pg["ratio_one"] = ratio(pg["operator_one"]["calls_per_s"], res["dsb_run_one"]["calls_per_s"])
        pg["ratio_many"] = ratio(pg["operator_many"]["calls_per_s"], res["dsb_run_many"]["calls_per_s"])
        pg["vs_apiserver_one"] = ratio(pg["operator_one"]["calls_per_s"], res["operator_one"]["calls_per_s"])
        pg["vs_apiserver_many"] = ratio(pg["operator_many"]["calls_per_s"], res["operator_many"]["calls_per_s"])
        worst = max(pg["operator_one"]["writes_per_call"], pg["operator_many"]["writes_per_call"])
        pg["targets"] = {  # issue 25's goals for this journal
            "ratio_one": PG_TARGET_RATIO_ONE, "met_ratio_one": pg["ratio_one"] >= PG_TARGET_RATIO_ONE,
            "calls_per_s_many": PG_TARGET_CALLS_PER_S_MANY,
            "met_calls_per_s_many": pg["operator_many"]["calls_per_s"] >= PG_TARGET_CALLS_PER_S_MANY,
            "writes_per_call": PG_TARGET_WRITES_PER_CALL, "met_writes": worst <= PG_TARGET_WRITES_PER_CALL,
        }  # fmt: skip
    return res


@contextlib.contextmanager
def sampled(pid: int, out: Path, *, enabled: bool) -> Iterator[None]:
    """py-spy samples the operator process (every thread, idle included: where its wall time goes)."""
    if not enabled:
        yield
        return
    exe = str(BIN / "py-spy") if (BIN / "py-spy").exists() else (shutil.which("py-spy") or "py-spy")
    spy = subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw", "--idle", "--rate", "250",
                            "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # py-spy attaches before the phase starts (a sample or two of idle is harmless)
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()


def summarize_samples(raw: Path, out: Path) -> dict[str, Any]:
    """Share of the operator's samples by where they end (self) and by what they pass through (inclusive)."""
    if not raw.exists():
        return {"error": f"py-spy wrote no samples ({raw.name} missing: is ptrace allowed?)"}
    own: Counter[str] = Counter()
    through: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [re.sub(r" \((.*/)?(?P<file>[^/]+):\d+\)$", r" (\g<file>)", fr) for fr in stack.split(";")]
        if frames[-1] == "_worker (thread.py)":
            continue  # an idle thread of a pool (asyncio.to_thread) waiting for work: not the operator's time
        total += n
        own[frames[-1]] += n
        for fr in set(frames):
            through[fr] += n
    share = {"self": {k: round(100 * v / total, 1) for k, v in own.most_common(30)},
             "inclusive": {k: round(100 * v / total, 1) for k, v in through.most_common(60)}}
    with out.open("w") as f:
        f.write(f"py-spy samples of the operator during the one-Workflow phase: {total}\n")
        for kind in ("self", "inclusive"):
            f.write(f"\n% of samples, {kind}:\n")
            f.writelines(f"{v:6.1f}  {k}\n" for k, v in share[kind].items())
    return {"samples": total, "file": str(out.relative_to(ROOT)), **share}


def _apply(kubeconfig: str, namespace: str, doc: dict[str, Any]) -> str:
    kubectl(kubeconfig, "apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(doc))
    return str(doc["metadata"]["name"])


def report(res: dict[str, Any]) -> None:
    rows = []
    journals = [("API server", res), *([("PostgreSQL", res["postgres"])] if "postgres" in res else [])]
    for journal, got in journals:
        for key, label in (("one", "1 Workflow"), ("many", f"{got['operator_many']['workflows']} Workflows at once")):
            op, local = got[f"operator_{key}"], res[f"dsb_run_{key}"]
            rows.append([journal, label, str(op["calls"]), fmt(op["calls_per_s"]), fmt(local["calls_per_s"]),
                         fmt(got[f"ratio_{key}"], "x", 2), fmt(op["writes_per_call"], "", 2),
                         str(op["status_bytes_max"])])
    print_table("no-op tool calls through the operator vs dsb run (local SQLite)",
                ["journal", "", "calls", "operator calls/s", "dsb run calls/s", "ratio", "API writes/call",
                 "max .status bytes"], rows)
    for key in ("one", "many"):
        op = res[f"operator_{key}"]
        print(f"\nwrites by resource ({key}; {op['ms_per_call']:.1f} ms per call), mean API server ms per write:")
        for name, count in op["writes_by_resource"].items():
            if count < 0.5:
                continue  # writes of this kind were all the cluster's own (measured while idle)
            print(f"  {name:40s} {count:10.0f} {op['apiserver_ms_per_write'].get(name, 0.0):8.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="tool calls of the one Workflow")
    parser.add_argument("--workflows", type=int, default=20, help="Workflows at once")
    parser.add_argument("--calls-each", type=int, default=100, help="tool calls of each of those")
    parser.add_argument("--kubeconfig", help="use this running cluster (cluster-admin) instead of starting one")
    parser.add_argument("--dsb", default=str(BIN / "dsb"), help="the dsb executable (operator and local runs)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the Workflows")
    parser.add_argument("--profile", action="store_true", help="cProfile the operator (results/*_profile.txt)")
    parser.add_argument("--py-spy", action="store_true",
                        help="sample the operator with py-spy during the one-Workflow phase (results/*_pyspy.txt)")
    parser.add_argument("--no-postgres", dest="postgres", action="store_false",
                        help="measure the API-server journal only (not also the operator with --journal postgresql://)")
    parser.add_argument("--tmp", help="where the temp files go")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "operator_throughput.json")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dsb-bench-operator-", dir=args.tmp))
    try:
        res = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(res)
    write_results(res, args.out)


if __name__ == "__main__":
    main()
