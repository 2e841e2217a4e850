"""Continue-as-new of a long sandbox session against one call of it (issue 38: "costs what one call costs",
goal within 5x).

    python benchmarks/continue_as_new.py                  # writes benchmarks/results/continue_as_new.json
    python benchmarks/continue_as_new.py --calls 10000 --rounds 3

Each round, on a fresh SQLite store and the local provider: a run makes ``--calls`` calls in one sandbox session
(each a one-byte ``write_file``: the local provider's cheapest call, no process), then continues as new; the next run makes one call and ends. Timed inside the workflow:

- a call: the median of the session's last 200 calls (each its own commit);
- the hand-over: from ``ctx.continue_as_new`` to the next run's first call returning, minus one call: the sandbox
  recorded as passed, the old run's end, the next run created, claimed, opened and its sandbox adopted;
- of it, the ending run's ``RunState`` (built by ``RunExecutor.drive`` for every run that ends, a fold of its
  whole journal: the one part that grows with the session), timed apart, so the rest is the hand-over proper.

Reported per round and as the median of the rounds; the ratios are in calls.
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

import durable_sandbox
import durable_sandbox.engine.executor as executor_module
from _common import RESULTS_DIR, fmt, fresh_dir, machine_info, print_table, ratio, write_results
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore

MARKS: dict[str, Any] = {}  # timings the workflow takes, read by the benchmark (this process only)


@durable_sandbox.workflow(name="bench-continue-as-new")
async def long_session(ctx: Any, inp: dict[str, Any]) -> int:
    async with ctx.sandbox("ws", provider="local") as sbx:
        if inp["phase"] == "next":
            await sbx.write_file("f", "x", operation_id="first")
            MARKS["next_first_call_done"] = time.perf_counter()
            return 1
        durations = []
        for i in range(inp["calls"]):
            t0 = time.perf_counter()
            await sbx.write_file("f", "x", operation_id=f"c{i}")
            durations.append(time.perf_counter() - t0)
        MARKS["call"] = statistics.median(durations[-200:])
        MARKS["continue"] = time.perf_counter()
        await ctx.continue_as_new({"phase": "next", "calls": inp["calls"]})
    return 0


def _timed_state_of() -> None:
    """Time ``state_of`` of the ending run (the first of the chain) where ``RunExecutor.drive`` calls it."""
    inner = executor_module.state_of

    def timed(run: Any, rows: Any, reader: Any = None) -> Any:
        t0 = time.perf_counter()
        state = inner(run, rows, reader) if reader is not None else inner(run, rows)
        if run.run_id == "long":
            MARKS["state"] = time.perf_counter() - t0
        return state

    executor_module.state_of = timed  # type: ignore[assignment]


def once(calls: int, base: str | None) -> dict[str, float]:
    async def go(d: Path) -> dict[str, float]:
        store = SqliteStore(d / "runs.db")
        engine = durable_sandbox.Engine(store, providers={"local": LocalProvider(d / "home")})
        MARKS.clear()
        state = await engine.run(long_session, {"phase": "first", "calls": calls}, run_id="long")
        assert state.status == "succeeded" and state.run_id == "long~1", (state.status, state.error)
        await engine.aclose()
        await store.close()
        handover = MARKS["next_first_call_done"] - MARKS["continue"] - MARKS["call"]
        return {"call": MARKS["call"], "handover": handover, "ending_state": MARKS.get("state", 0.0),
                "handover_proper": handover - MARKS.get("state", 0.0)}

    with fresh_dir("continue", base) as d:
        return asyncio.run(go(d))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10_000, help="calls of the session before it continues (10,000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="directory for the temp stores (default: system temp)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "continue_as_new.json"))
    args = ap.parse_args(argv)
    _timed_state_of()
    samples = []
    for round_no in range(args.rounds):
        print(f"round {round_no + 1} of {args.rounds} ({args.calls} calls) ...", flush=True)
        samples.append(once(args.calls, args.tmp))
    med = {k: statistics.median(s[k] for s in samples) for k in ("call", "handover", "ending_state", "handover_proper")}
    call = med["call"]
    res: dict[str, Any] = {
        "machine": machine_info(),
        "params": vars(args),
        "samples_seconds": samples,
        "median_seconds": med,
        "ratios": {f"{k}_vs_call": ratio(med[k], call) for k in ("handover", "ending_state", "handover_proper")},
    }
    res["targets_met"] = {"handover_within_5x_call": (res["ratios"]["handover_vs_call"] or 0) <= 5}
    print_table(f"Continue-as-new after {args.calls} calls vs one call (median of {args.rounds})",
                ["what", "ms", "÷ a call"],
                [["one call (1-byte write_file)", fmt(call * 1e3, digits=2), "1"]]
                + [[label, fmt(med[k] * 1e3, digits=2), fmt(ratio(med[k], call), "x", 1)]
                   for label, k in (("the hand-over to the next run, in all", "handover"),
                                    ("  of it: the ending run's RunState", "ending_state"),
                                    ("  of it: the rest (pass, create, claim, adopt)", "handover_proper"))])
    print("targets met:", res["targets_met"])
    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
