"""Continue-as-new of a long sandbox session against one call of it (issue 38: "costs what one call costs",
goal within 5x), with the hand-over as it was before issue 38's fix timed in the same run.

    python benchmarks/continue_as_new.py                  # writes benchmarks/results/continue_as_new.json
    python benchmarks/continue_as_new.py --calls 10000 --rounds 3

Each round, on a fresh SQLite store and the local provider: a run makes ``--calls`` calls in one sandbox session
(each a one-byte ``write_file``: the local provider's cheapest call, no process), then continues as new; the next
run makes one call and ends. Timed inside the workflow, on the wall clock and on the process's CPU clock (on a
shared machine the wall clock also counts the time other work held the CPU):

- a call: the median of the session's last 200 calls (each its own commit);
- the hand-over: from ``ctx.continue_as_new`` to the next run's first call returning, minus one call: the sandbox
  recorded as passed, the old run's final commit creating the next run, the next run claimed, opened and its
  sandbox adopted;
- of it, the ending run's ``RunState`` (what ``RunExecutor.drive`` returns for the run that ended), timed apart.

Three ways each round, in turn on fresh stores:

- ``now``: the engine as it is (the ending run's state folds nothing; the next run created by the final commit);
- ``kept``: the same, with the ending session's object kept referenced by the benchmark until the round is over:
  what ``now`` costs more is Python freeing what that session holds in memory of its calls as the old run's
  workflow frames end (once a result and a call object per call; now the journal's own dicts);
- ``before``: the hand-over as it was: the ending run's snapshots and recoveries folded from its whole journal when
  its state is built, and the next run created by a statement of its own before the final commit (the store's
  ``commit_with_new_run`` hidden, so the engine falls back to ``create_run`` then ``commit``).

Reported per round and as the median of the rounds; the ratios are in calls, and now against before.
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
SETTINGS: dict[str, bool] = {"eager_state": False, "keep_session": False}  # how this round runs (this process)
KEYS = ("call", "handover", "ending_state", "handover_proper")


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


@durable_sandbox.workflow(name="bench-continue-as-new")
async def long_session(ctx: Any, inp: dict[str, Any]) -> int:
    async with ctx.sandbox("ws", provider="local") as sbx:
        if inp["phase"] == "next":
            await sbx.write_file("f", "x", operation_id="first")
            MARKS["next_first_call_done"] = _clocks()
            return 1
        walls, cpus = [], []
        for i in range(inp["calls"]):
            w0, c0 = _clocks()
            await sbx.write_file("f", "x", operation_id=f"c{i}")
            w1, c1 = _clocks()
            walls.append(w1 - w0)
            cpus.append(c1 - c0)
        MARKS["call"] = (statistics.median(walls[-200:]), statistics.median(cpus[-200:]))
        del walls, cpus
        if SETTINGS["keep_session"]:
            MARKS["session"] = sbx  # freed after the round instead of as the old run's frames end
        MARKS["continue"] = _clocks()
        await ctx.continue_as_new({"phase": "next", "calls": inp["calls"]})
    return 0


class SeparateCreate:
    """The store without ``commit_with_new_run``: the engine creates the next run apart, as before issue 38's fix."""

    def __init__(self, inner: SqliteStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "commit_with_new_run":
            raise AttributeError(name)
        return getattr(self._inner, name)


def _timed_state_of() -> None:
    """Time ``state_of`` of the ending run (the first of the chain) where ``RunExecutor.drive`` calls it; the
    "before" way also folds its snapshots and recoveries there, as building the state did then."""
    inner = executor_module.state_of

    def timed(run: Any, rows: Any, reader: Any = None) -> Any:
        w0, c0 = _clocks()
        state = inner(run, rows, reader) if reader is not None else inner(run, rows)
        if SETTINGS["eager_state"]:
            _ = (state.snapshots, state.recovery_count)
        w1, c1 = _clocks()
        if run.run_id == "long":
            MARKS["state"] = (w1 - w0, c1 - c0)
        return state

    executor_module.state_of = timed  # type: ignore[assignment]


def once(calls: int, base: str | None, way: str = "now") -> dict[str, dict[str, float]]:
    """One round one way: seconds by clock (``wall``, ``cpu``) of each of :data:`KEYS`."""

    async def go(d: Path) -> dict[str, dict[str, float]]:
        sqlite = SqliteStore(d / "runs.db")
        store: Any = sqlite if way == "now" else SeparateCreate(sqlite)
        SETTINGS["eager_state"] = way == "before"
        SETTINGS["keep_session"] = way == "kept"
        engine = durable_sandbox.Engine(store, providers={"local": LocalProvider(d / "home")})
        MARKS.clear()
        state = await engine.run(long_session, {"phase": "first", "calls": calls}, run_id="long")
        assert state.status == "succeeded" and state.run_id == "long~1", (state.status, state.error)
        await engine.aclose()
        await sqlite.close()
        out: dict[str, dict[str, float]] = {}
        for i, clock in enumerate(("wall", "cpu")):
            call = MARKS["call"][i]
            handover = MARKS["next_first_call_done"][i] - MARKS["continue"][i] - call
            ending = MARKS["state"][i] if "state" in MARKS else 0.0
            out[clock] = {"call": call, "handover": handover, "ending_state": ending,
                          "handover_proper": handover - ending}
        return out

    with fresh_dir("continue", base) as d:
        return asyncio.run(go(d))


def _median(samples: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {clock: {k: statistics.median(s[clock][k] for s in samples) for k in KEYS} for clock in ("wall", "cpu")}


def _table(title: str, med: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> None:
    rows = []
    labels = (("one call (1-byte write_file)", "call"), ("the hand-over to the next run, in all", "handover"),
              ("  of it: the ending run's RunState", "ending_state"),
              ("  of it: the rest (pass, end+create, claim, adopt)", "handover_proper"))
    for label, k in labels:
        row = [label]
        for clock in ("wall", "cpu"):
            now, call = med[clock][k], med[clock]["call"]
            row += [fmt(now * 1e3, digits=2), fmt(ratio(now, call), "x", 1),
                    fmt(before[clock][k] * 1e3, digits=2), fmt(ratio(before[clock][k], before[clock]["call"]), "x", 1)]
        rows.append(row)
    print_table(title, ["what", "wall ms", "÷ call", "before ms", "÷ call", "cpu ms", "÷ call", "before ms",
                        "÷ call"], rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10_000, help="calls of the session before it continues (10,000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="directory for the temp stores (default: system temp)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "continue_as_new.json"))
    args = ap.parse_args(argv)
    _timed_state_of()
    samples: dict[str, list[dict[str, dict[str, float]]]] = {"now": [], "kept": [], "before": []}
    for round_no in range(args.rounds):
        print(f"round {round_no + 1} of {args.rounds} ({args.calls} calls, now and before) ...", flush=True)
        for way in ("now", "kept", "before"):
            samples[way].append(once(args.calls, args.tmp, way))
    med, kept, before = _median(samples["now"]), _median(samples["kept"]), _median(samples["before"])
    res: dict[str, Any] = {
        "machine": machine_info(),
        "params": vars(args),
        "samples_seconds": samples["now"],
        "before_samples_seconds": samples["before"],
        "kept_samples_seconds": samples["kept"],
        "kept_median_seconds": kept["wall"],
        "kept_median_cpu_seconds": kept["cpu"],
        "kept_ratios": {clock: ratio(kept[clock]["handover"], kept[clock]["call"]) for clock in ("wall", "cpu")},
        "median_seconds": med["wall"],
        "median_cpu_seconds": med["cpu"],
        "before_median_seconds": before["wall"],
        "before_median_cpu_seconds": before["cpu"],
        "ratios": {f"{k}_vs_call": ratio(med["wall"][k], med["wall"]["call"]) for k in KEYS[1:]},
        "cpu_ratios": {f"{k}_vs_call": ratio(med["cpu"][k], med["cpu"]["call"]) for k in KEYS[1:]},
        "before_ratios": {f"{k}_vs_call": ratio(before["wall"][k], before["wall"]["call"]) for k in KEYS[1:]},
        "handover_now_vs_before": {clock: ratio(med[clock]["handover"], before[clock]["handover"])
                                   for clock in ("wall", "cpu")},
    }
    res["targets_met"] = {"handover_within_5x_call": (res["ratios"]["handover_vs_call"] or 0) <= 5,
                          "handover_within_5x_call_cpu": (res["cpu_ratios"]["handover_vs_call"] or 0) <= 5}
    _table(f"Continue-as-new after {args.calls} calls vs one call (median of {args.rounds}; before = as before "
           f"issue 38's fix, same run)", med, before)
    print("hand-over now ÷ before:", res["handover_now_vs_before"])
    print("hand-over with the ending session freed after it (kept), ÷ a call:", res["kept_ratios"])
    print("targets met:", res["targets_met"])
    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
