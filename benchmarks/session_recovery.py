"""A sandbox session's calls, checkpoints and recovery on the local provider, this tree against another, interleaved.

    python benchmarks/session_recovery.py                                  # this tree alone
    python benchmarks/session_recovery.py --against /path/to/tree/operator # A/B: ratio this tree / that one

What runs, each in a fresh child process (a fresh store and provider home) importing the package from the tree
measured (``PYTHONPATH`` first; the child checks where it imported it from):
- ``calls``: one ``ctx.sandbox`` block of ``--calls`` no-op calls (``write_file`` of one byte), a snapshot every
  ``--snapshot-every`` (each taken, recorded, the superseded one deleted);
- ``recovery``: the same calls without snapshots, then a loss injected after the last one: the sandbox is rebuilt
  fresh and every call replayed with its outcome checked (``--calls`` replays).
Rounds run every tree once per workload, the two back to back (which goes first alternates), so load drift on a
shared machine hits both alike; the figure is the median over the rounds (the first round is a discarded warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, fresh_dir, machine_info, print_table, ratio, write_results

HERE = Path(__file__).resolve()
THIS_TREE = HERE.parents[1] / "operator"
WORKLOADS = ("calls", "recovery")


def _child(workload: str, calls: int, snapshot_every: int, home: Path) -> None:
    """In the child: run the workload once and print its seconds and where the package came from (JSON)."""
    import durable_sandbox as ds
    from durable_sandbox.stores import SqliteStore

    @ds.workflow(name=f"bench-session-{workload}")
    async def flow(ctx: ds.Context, n: int) -> int:
        options: dict[str, Any] = ({"snapshot_every": snapshot_every} if workload == "calls"
                                   else {"inject_loss_after": n})
        async with ctx.sandbox("box", provider="local", **options) as sbx:
            for i in range(n):
                await sbx.write_file(f"f{i % 16}.txt", "x")
            return int(sbx.result()["recoveryCount"])

    async def go() -> tuple[float, float]:
        store = SqliteStore(home / "runs.db")
        engine = ds.Engine(store)
        # A small run first, not timed: every module the workload touches is imported (and compiled, where
        # bytecode is not written) before the clock starts, so a tree of more, smaller modules pays nothing here.
        await engine.run(flow, max(2, snapshot_every) if workload == "calls" else 2, run_id="warm-up")
        t0, c0 = time.perf_counter(), time.process_time()
        state = await engine.run(flow, calls, run_id="bench")
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        assert state.status == "succeeded", (state.status, state.error)
        assert state.result == (1 if workload == "recovery" else 0), state.result
        await store.close()
        return dt, dc

    seconds, cpu = asyncio.run(go())
    print(json.dumps({"seconds": seconds, "cpu": cpu, "package": str(Path(ds.__file__).resolve().parents[1])}))


def once(tree: Path, workload: str, calls: int, snapshot_every: int, base: str | None) -> tuple[float, float]:
    """One child run of ``workload`` importing the package from ``tree`` (an ``operator/`` directory): its wall
    seconds and the CPU seconds of the child's own process (what the session's code costs, less sensitive to
    other work on the machine; the local provider's shell processes are not in it)."""
    with fresh_dir("session", base) as d:
        env = {**os.environ, "PYTHONPATH": str(tree), "DURABLE_SANDBOX_HOME": str(d / "home")}
        env.pop("DURABLE_SANDBOX_FAULT", None)
        proc = subprocess.run([sys.executable, str(HERE), "--child", workload, "--calls", str(calls),
                               "--snapshot-every", str(snapshot_every), "--home", str(d)],
                              env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{workload} on {tree} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        if Path(out["package"]) != tree.resolve():
            raise RuntimeError(f"the child imported the package from {out['package']}, not {tree}; "
                               f"is another install first on its path?")
        return float(out["seconds"]), float(out["cpu"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="calls per session (default 200)")
    ap.add_argument("--snapshot-every", type=int, default=20, help="the calls workload's snapshot interval")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--against", type=Path, help="another tree's operator/ directory: the baseline of the ratios")
    ap.add_argument("--tmp", default=None, help="directory for the temp stores (default: system temp)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "session_recovery.json"))
    ap.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.calls, args.snapshot_every, args.home)
        return {}

    trees = {"this": THIS_TREE, **({"baseline": args.against.resolve()} if args.against else {})}
    samples: dict[str, dict[str, list[float]]] = {t: {w: [] for w in WORKLOADS} for t in trees}
    cpu: dict[str, dict[str, list[float]]] = {t: {w: [] for w in WORKLOADS} for t in trees}
    for round_no in range(args.rounds + 1):
        print(f"round {round_no}{' (warm-up)' if round_no == 0 else ''} ...", flush=True)
        for workload in WORKLOADS:
            # Every other round the other tree goes first, so neither always runs on a machine the first warmed.
            order = list(trees.items()) if round_no % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                seconds, cpu_seconds = once(tree, workload, args.calls, args.snapshot_every, args.tmp)
                if round_no:
                    samples[name][workload].append(seconds)
                    cpu[name][workload].append(cpu_seconds)

    median = {t: {w: statistics.median(s) for w, s in per.items()} for t, per in samples.items()}
    median_cpu = {t: {w: statistics.median(s) for w, s in per.items()} for t, per in cpu.items()}
    both = "baseline" in trees
    res: dict[str, Any] = {
        "machine": machine_info(),
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("child", "home")},
        "trees": {t: str(p) for t, p in trees.items()},
        "samples_seconds": samples,
        "median_seconds": median,
        "cpu_samples_seconds": cpu,
        "median_cpu_seconds": median_cpu,
        "calls_per_s": {t: {w: args.calls / s for w, s in per.items()} for t, per in median.items()},
        "ratios_this_over_baseline": ({w: ratio(median["this"][w], median["baseline"][w]) for w in WORKLOADS}
                                      if both else {}),
        "cpu_ratios_this_over_baseline": ({w: ratio(median_cpu["this"][w], median_cpu["baseline"][w])
                                           for w in WORKLOADS} if both else {}),
    }
    rows = [[w, *[f"{fmt(median[t][w], ' s', 3)} ({fmt(median_cpu[t][w], ' s', 3)})" for t in trees],
             fmt(res["ratios_this_over_baseline"].get(w), "", 3) if both else "-",
             fmt(res["cpu_ratios_this_over_baseline"].get(w), "", 3) if both else "-"] for w in WORKLOADS]
    print_table(f"a session of {args.calls} calls (local provider), median of {args.rounds} rounds: wall (CPU)",
                ["workload", *trees, "this / baseline", "CPU this / baseline"], rows)
    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
