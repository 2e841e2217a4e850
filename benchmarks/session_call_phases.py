"""One session call's path with the API-server journal, phase by phase, against the e2e tier's control plane.

    python benchmarks/session_call_phases.py                 # writes benchmarks/results/session_call_phases.json
    python benchmarks/session_call_phases.py --calls 100

What runs: the control plane (scripts/controlplane-build), the CRDs, and the operator (``dsb operator
--allow-local-provider --session-port``, the API-server journal) started through ``session_phase_timer.py``, which
times the phases of each call inside the operator. A ServiceAccount granted ``create sandboxes/calls`` makes
``--calls`` no-op calls (``write_file`` of one byte) one at a time to one local Sandbox with durable_sandbox.client
(after warm-up calls: the client's connection, the call journal made, the hold taken). Per call: what the client
waited for (``client``), the operator's own handling of it (``total``, ``SessionService.call``) and its phases
(session_phase_timer.py says which); ``http`` is ``client - total``: the request and the answer on the wire, the
HTTP server's and the client's own work. The figures are per call: mean and median of the calls measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.ports

from tests.ports import free_port

from _common import RESULTS_DIR, fmt, machine_info, print_table, run_in_workdir, stop_process
from operator_throughput import ROOT, control_plane, kubectl
from session_calls import HOLD_S, caller_token, ready_sandboxes, through_api, wait_http

WARM_UP = 5
# The phases in the order of a call's path (``other``: the session's own work, what no phase covers).
ORDER = ("client", "http", "total", "auth", "token_review", "access_review", "find", "commit_1", "patch_1",
         "provider", "commit_2", "patch_2", "other")


def per_call(client: list[float], inside: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each measured call's phases (seconds), the client's time and what neither the phases nor the operator's
    handling cover added in."""
    rows = []
    for waited, phases in zip(client, inside, strict=True):
        row = {**phases, "client": waited, "http": waited - phases["total"]}
        covered = sum(v for k, v in phases.items() if k in ("auth", "find", "provider") or k.startswith("commit_"))
        row["other"] = phases["total"] - covered
        rows.append(row)
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per phase: mean and median per call (ms; a phase a call did not reach counts 0), how many calls had it."""
    names = [n for n in ORDER if any(n in r for r in rows)] + sorted({k for r in rows for k in r} - set(ORDER))
    out = {}
    for name in names:
        values = [r.get(name, 0.0) * 1000 for r in rows]
        out[name] = {"mean_ms": statistics.fmean(values), "p50_ms": statistics.median(values),
                     "calls_with_it": sum(1 for r in rows if name in r)}
    return out


def measured(phases_file: Path, count: int, timeout: float = 30) -> list[dict[str, float]]:
    deadline = time.monotonic() + timeout
    while True:
        found = json.loads(phases_file.read_text()) if phases_file.exists() else []
        if len(found) >= count:
            return list(found[-count:]) if count else []
        if time.monotonic() > deadline:
            raise RuntimeError(f"the operator wrote {len(found)} calls' phases, not {count}, in {timeout:.0f}s")
        time.sleep(0.2)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    with control_plane(args.kubeconfig, workdir) as kubeconfig:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/sandboxes.durable-sandbox.dev",
                "--timeout=60s")
        namespace, port, home = f"bench-phases-{os.getpid()}", free_port(), workdir / "operator-home"
        home.mkdir()
        kubectl(kubeconfig, "create", "namespace", namespace)
        env = {**os.environ, "KUBECONFIG": kubeconfig, "DURABLE_SANDBOX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        phases_file = workdir / "phases.json"
        log = (workdir / "operator.log").open("wb")
        operator = subprocess.Popen([sys.executable, str(Path(__file__).parent / "session_phase_timer.py"),
                                     str(phases_file), "--", "operator", "--allow-local-provider", "-n", namespace,
                                     "--session-port", str(port), "--session-host", "127.0.0.1",
                                     "--session-hold-seconds", str(HOLD_S), "--session-max-calls-per-second",
                                     "100000"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/healthz", 120)
            ready_sandboxes(kubeconfig, namespace, 1)
            token = caller_token(kubeconfig, namespace)
            through_api(url, namespace, token, WARM_UP, "warm")
            started = time.time()
            client = through_api(url, namespace, token, args.calls, "api")
            res["window_utc"] = [time.strftime("%H:%M:%S", time.gmtime(t)) for t in (started, time.time())]
            res["load_average"] = list(os.getloadavg())
            inside = measured(phases_file, WARM_UP + args.calls)[WARM_UP:]
        finally:
            stop_process(operator)
            log.close()
    res["phases"] = summary(per_call(client, inside))
    return res


def report(res: dict[str, Any]) -> None:
    phases = res["phases"]
    client = phases["client"]["mean_ms"]
    print_table("one no-op session call (write_file of 1 byte), API-server journal: per call", [
        "phase", "mean ms", "p50 ms", "share of client mean", "calls with it"], [
        [name, fmt(p["mean_ms"], digits=2), fmt(p["p50_ms"], digits=2), fmt(100 * p["mean_ms"] / client, "%"),
         str(p["calls_with_it"])] for name, p in phases.items()])
    print(f"window {res.get('window_utc')}, load average {res.get('load_average')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls measured (after the warm-up calls)")
    parser.add_argument("--kubeconfig", help="use this running cluster (cluster-admin) instead of starting one")
    parser.add_argument("--tmp", help="where the temp files go")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "session_call_phases.json")
    args = parser.parse_args()
    run_in_workdir("phases", args.tmp, lambda workdir: run(args, workdir), report, args.out)


if __name__ == "__main__":
    main()
