"""The session call API's own work per call (issue 35), in one process, this tree against another, interleaved.

    python benchmarks/session_call_cpu.py                                  # this tree alone
    python benchmarks/session_call_cpu.py --against /path/to/tree/operator # A/B: ratio this tree / that one

What runs, each in a fresh child process (a fresh SQLite store and local-provider home) importing the package from
the tree measured (``PYTHONPATH`` first; the child checks where it imported it from): one Sandbox's session
(``SessionService`` over ``SessionJournal``, an authorizer that allows, a gate over one local sandbox, the hold
kept for the whole run) takes ``--calls`` no-op calls (``write_file`` of one byte) one after the other, after an
untimed warm-up call. What is timed is the service's work (the journal, the hold, the session) plus the local
provider's call and SQLite's commits: no HTTP, no API server. The figures are the mean time per call over the
first and the last ``--window`` calls (a call's work that grows with the session shows as a later window slower
than the first) and the child's CPU time. Rounds run both trees back to back (which goes first alternates); the
figure is the median over the rounds (the first round is a discarded warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, fresh_dir, machine_info, print_table, ratio, write_results

HERE = Path(__file__).resolve()
THIS_TREE = HERE.parents[1] / "operator"
FIGURES = ("first", "last", "cpu")


def _child(calls: int, window: int, home: Path) -> None:
    """In the child: one session of ``calls`` calls; prints the per-call means of the first and last windows, the
    CPU seconds and where the package came from (JSON)."""
    import asyncio
    import contextlib
    import time
    from collections.abc import AsyncIterator

    import durable_sandbox as ds
    from durable_sandbox.providers.contract import SandboxSpec
    from durable_sandbox.providers.local import LocalProvider
    from durable_sandbox.sessions.hold import HoldSettings
    from durable_sandbox.sessions.journal import SandboxRef, SessionJournal
    from durable_sandbox.sessions.models import Limits, WriteFileRequest
    from durable_sandbox.sessions.service import SessionService
    from durable_sandbox.stores.sqlite import SqliteStore

    class Allow:
        async def check(self, token: str | None, namespace: str, name: str) -> str:
            return "bench"

        check_update = check

        async def check_workflow(self, token: str | None, namespace: str, name: str, verb: str) -> str:
            return "bench"

    class Gate:
        def __init__(self, provider: LocalProvider, handle: Any) -> None:
            self.provider, self.handle = provider, handle

        async def find(self, namespace: str, name: str) -> SandboxRef:
            return SandboxRef(namespace, name, "uid-1")

        @contextlib.asynccontextmanager
        async def live(self, ref: SandboxRef) -> AsyncIterator[tuple[Any, Any]]:
            yield self.handle, self.provider

        async def replaced(self, ref: SandboxRef, lost: str) -> Any:
            raise AssertionError("no loss in this benchmark")

        async def lineage(self, ref: SandboxRef) -> dict[str, str]:
            return {self.handle.id: ""}

        async def rewound(self, ref: SandboxRef, to_call: int, rewound: list[str]) -> None:
            return None

    async def go() -> dict[str, float]:
        provider = LocalProvider(home / "sandboxes")
        handle = await provider.provision(SandboxSpec(owner="bench/uid-1"), lease_seconds=3600)
        store = SqliteStore(home / "runs.db")
        journal = SessionJournal(store, worker_id="bench", lease_ttl=60.0, owned=False,
                                 hold=HoldSettings(idle_seconds=3600, max_seconds=36000))
        service = SessionService(Allow(), Gate(provider, handle), lambda _ns: journal,
                                 Limits(max_calls_per_second=1e9))

        async def call(op: str) -> None:
            answer = await service.call("t", "bench", "box", WriteFileRequest(operationId=op, path="f", contents="x"))
            assert answer.exitCode == 0 and not answer.replayed

        await call("warm-up")
        times: list[float] = []
        c0 = time.process_time()
        for i in range(calls):
            t0 = time.perf_counter()
            await call(f"c{i}")
            times.append(time.perf_counter() - t0)
        cpu = time.process_time() - c0
        await journal.aclose()
        await store.close()
        return {"first": statistics.fmean(times[:window]), "last": statistics.fmean(times[-window:]), "cpu": cpu}

    figures = asyncio.run(go())
    print(json.dumps({**figures, "package": str(Path(ds.__file__).resolve().parents[1])}))


def once(tree: Path, calls: int, window: int, base: str | None) -> dict[str, float]:
    """One child run importing the package from ``tree`` (an ``operator/`` directory)."""
    with fresh_dir("session-cpu", base) as d:
        env = {**os.environ, "PYTHONPATH": str(tree), "DURABLE_SANDBOX_HOME": str(d / "home")}
        env.pop("DURABLE_SANDBOX_FAULT", None)
        proc = subprocess.run([sys.executable, str(HERE), "--child", "--calls", str(calls), "--window", str(window),
                               "--home", str(d)], env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"the child importing {tree} failed:\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        if Path(out["package"]) != tree.resolve():
            raise RuntimeError(f"the child imported {out['package']}, not {tree}: PYTHONPATH did not come first")
        return {k: float(out[k]) for k in FIGURES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--window", type=int, default=100, help="calls in the first and the last window")
    parser.add_argument("--rounds", type=int, default=4, help="rounds measured (after one warm-up round)")
    parser.add_argument("--against", type=Path, help="another tree's operator/ directory: the baseline")
    parser.add_argument("--tmp", help="where the temp files go")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "session_call_cpu.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.calls, args.window, args.home)
        return
    trees = {"this": THIS_TREE, **({"against": args.against} if args.against else {})}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for n in range(args.rounds + 1):
        order = list(trees) if n % 2 == 0 else list(reversed(trees))
        for name in order:
            measured = once(trees[name], args.calls, args.window, args.tmp)
            if n:
                samples[name].append(measured)
    medians = {name: {k: statistics.median(s[k] for s in runs) for k in FIGURES} for name, runs in samples.items()}
    rows = [[name, fmt(m["first"] * 1000, " ms", 2), fmt(m["last"] * 1000, " ms", 2), fmt(m["cpu"], " s", 2)]
            for name, m in medians.items()]
    result: dict[str, Any] = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                              "trees": {k: str(v) for k, v in trees.items()}, "medians": medians,
                              "samples": samples}
    if "against" in medians:
        result["ratios"] = {k: ratio(medians["this"][k], medians["against"][k]) for k in FIGURES}
        rows.append(["this / against", *(fmt(result["ratios"][k], "", 2) for k in FIGURES)])
    print_table("A Sandbox's session calls in one process (issue 35)", [f"tree ({args.calls} calls)", f"first {args.window}: per call", f"last {args.window}: per call",
                 "CPU"], rows)
    write_results(result, args.out)


if __name__ == "__main__":
    main()
