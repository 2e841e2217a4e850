"""Sync and async step functions, ours against LangGraph's Functional API, interleaved.

    python benchmarks/sync_steps.py                  # writes benchmarks/results/sync_steps.json
    python benchmarks/sync_steps.py --steps 1000 --rounds 5

The same measurements as ``engine_steps.py`` (no-op steps, each journaled before the next; a fresh
store per measurement; the call that does the work is timed), but taken in rounds: each round runs
every system once, in the same order, so that a machine whose load drifts (a shared VM) affects every
system alike. Reported per system: the median over the rounds, and the ratio of ours to LangGraph's
fastest variant. One warm-up round is discarded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, fmt, machine_info, print_table, ratio, write_results
from engine_steps import LG_VARIANTS, engine_throughput_once, lg_throughput_once


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="steps per run (default 1000)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tmp", default=None, help="directory for the temp stores (default: system temp)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "sync_steps.json"))
    args = ap.parse_args(argv)
    n, base = args.steps, args.tmp

    systems: dict[str, Callable[[], float]] = {
        "durable-sandbox, async step function": lambda: engine_throughput_once(n, base=base),
        "durable-sandbox, sync step function": lambda: engine_throughput_once(n, base=base, sync=True),
    }
    for label, is_async, synchronous in LG_VARIANTS:
        systems[f"LangGraph functional, {label}"] = (
            lambda is_async=is_async, synchronous=synchronous: lg_throughput_once(
                n, is_async=is_async, synchronous=synchronous, base=base))
    samples: dict[str, list[float]] = {name: [] for name in systems}
    for round_no in range(args.rounds + 1):
        print(f"round {round_no}{' (warm-up)' if round_no == 0 else ''} ...", flush=True)
        for name, once in systems.items():
            seconds = once()
            if round_no:
                samples[name].append(seconds)

    rates = {name: n / statistics.median(s) for name, s in samples.items()}
    lg_best = max((name for name in rates if name.startswith("LangGraph")), key=lambda k: rates[k])
    ours = {kind: rates[f"durable-sandbox, {kind} step function"] for kind in ("async", "sync")}
    res: dict[str, Any] = {
        "machine": machine_info(),
        "params": vars(args),
        "samples_seconds": samples,
        "steps_per_s": rates,
        "langgraph_fastest": lg_best,
        "ratios": {f"{kind}_vs_langgraph_fastest": ratio(v, rates[lg_best]) for kind, v in ours.items()}
        | {"sync_vs_async": ratio(ours["sync"], ours["async"])},
    }
    # Issue 33's goal: both kinds of step function at 20x LangGraph's fastest or more (issue 8's was 10x).
    res["targets_met"] = {f"{kind}_20x_langgraph": res["ratios"][f"{kind}_vs_langgraph_fastest"] >= 20 for kind in ours}
    rows = [[name, fmt(rate, digits=0), fmt(ratio(ours["sync"], rate), "x", 2), fmt(ratio(ours["async"], rate), "x", 2)]
            for name, rate in rates.items()]
    print_table(f"No-op steps/s ({n} steps, median of {args.rounds} interleaved rounds)",
                ["system", "steps/s", "ours sync ÷ it", "ours async ÷ it"], rows)
    print("ratios:", res["ratios"], "targets met:", res["targets_met"])
    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
