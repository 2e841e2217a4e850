"""A child workflow against a step: what starting a child run and waiting for it costs, in the same run.

    python benchmarks/child_workflows.py                  # writes benchmarks/results/child_workflows.json
    python benchmarks/child_workflows.py --children 200 --rounds 5

Two workflows on a fresh SQLite store each, in interleaved rounds (each round runs both once, so a machine
whose load drifts affects both alike; one warm-up round is discarded):

- ``steps``: N no-op steps, each journaled before the next (the baseline: one step);
- ``children``: N child workflows one after another, each a run of its own whose first (only) step is a
  no-op: the child's creation, the parent's start record, the child's execution (lease, journal, first step,
  final commit) and the parent's outcome record.

Reported: seconds per step, seconds per child (start to the child's first step and back), and their ratio,
the child's overhead in steps. Issue 38 asks for the figure; there is no target yet.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, fresh_dir, machine_info, print_table, ratio, write_results
from durable_sandbox.engine import Engine, workflow
from durable_sandbox.stores import SqliteStore


def noop() -> int:
    return 1


@workflow(name="bench-child")
async def child_wf(ctx: Any, n: int) -> int:
    return await ctx.step("first", noop)


@workflow(name="bench-child-parent")
async def parent_wf(ctx: Any, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.child_workflow(child_wf, i, id=f"c{i}")
    return total


@workflow(name="bench-child-steps")
async def steps_wf(ctx: Any, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(f"s{i}", noop)
    return total


def once(wf: Any, n: int, base: str | None) -> float:
    async def go(db: Path) -> float:
        store = SqliteStore(db)
        engine = Engine(store)
        t0 = time.perf_counter()
        state = await engine.run(wf, n, run_id="r1")
        dt = time.perf_counter() - t0
        assert state.status == "succeeded" and state.result == n, (state.status, state.error)
        await engine.aclose()
        await store.close()
        return dt

    with fresh_dir("children", base) as d:
        return asyncio.run(go(d / "runs.db"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--children", type=int, default=200, help="children (and steps) per run (default 200)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tmp", default=None, help="directory for the temp stores (default: system temp)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "child_workflows.json"))
    args = ap.parse_args(argv)
    n = args.children
    samples: dict[str, list[float]] = {"steps": [], "children": []}
    for round_no in range(args.rounds + 1):
        print(f"round {round_no}{' (warm-up)' if round_no == 0 else ''} ...", flush=True)
        step_s, child_s = once(steps_wf, n, args.tmp), once(parent_wf, n, args.tmp)
        if round_no:
            samples["steps"].append(step_s)
            samples["children"].append(child_s)
    per_step = statistics.median(samples["steps"]) / n
    per_child = statistics.median(samples["children"]) / n
    res: dict[str, Any] = {
        "machine": machine_info(),
        "params": vars(args),
        "samples_seconds": samples,
        "seconds_per_step": per_step,
        "seconds_per_child": per_child,
        "ratios": {"child_vs_step": ratio(per_child, per_step)},
    }
    print_table(f"A child workflow vs a step ({n} each, median of {args.rounds} interleaved rounds)",
                ["what", "ms each", "÷ a step"],
                [["no-op step", fmt(per_step * 1e3, digits=3), "1"],
                 ["child workflow (one no-op step)", fmt(per_child * 1e3, digits=3),
                  fmt(ratio(per_child, per_step), "x", 1)]])
    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
