"""Continue-as-new of a long sandbox session against one call of it (issue 38: "costs what one call costs",
goal within 5x), at several session lengths, with the SQLite store checkpointing its WAL as it did before (SQLite's
automatic checkpoint, inside a commit) timed in the same run.

    python benchmarks/continue_as_new.py                  # writes benchmarks/results/continue_as_new.json
    python benchmarks/continue_as_new.py --calls 9000 10000 11000 --rounds 3

Each round, on a fresh SQLite store and the local provider: a run makes ``--calls`` calls in one sandbox session
(each a one-byte ``write_file``: the local provider's cheapest call, no process), then continues as new; the next
run makes one call and ends. Timed inside the workflow on three clocks: the wall clock, the process's CPU clock
(all threads: the store's checkpoint thread included) and the CPU clock of the thread that runs the workflow (the
event loop's: what the run itself waits for); on a shared machine the wall clock also counts the time other work
held the CPU:

- a call: the median of the session's last 200 calls (each its own commit);
- the hand-over: from ``ctx.continue_as_new`` to the next run's first call returning, minus one call: the sandbox
  recorded as passed, the old run's final commit creating the next run, the next run claimed, opened and its
  sandbox adopted;
- of it, the ending run's ``RunState`` (what ``RunExecutor.drive`` returns for the run that ended), timed apart.

Two ways each round, in turn on fresh stores:

- ``now``: the store as it is (its commit connection never checkpoints; the store checkpoints from a thread,
  stores/sqlite_checkpoint.py);
- ``inline``: the store as it was: SQLite's automatic checkpoint every 4,096 pages, run by whichever commit
  passes it (the store's own checkpoints switched off).

Reported per length as the median of the rounds; the ratios are in calls.
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
KEYS = ("call", "handover", "ending_state", "handover_proper")
CLOCKS = ("wall", "cpu", "thread_cpu")


def _clocks() -> tuple[float, float, float]:
    return time.perf_counter(), time.process_time(), time.thread_time()


@durable_sandbox.workflow(name="bench-continue-as-new")
async def long_session(ctx: Any, inp: dict[str, Any]) -> int:
    async with ctx.sandbox("ws", provider="local") as sbx:
        if inp["phase"] == "next":
            await sbx.write_file("f", "x", operation_id="first")
            MARKS["next_first_call_done"] = _clocks()
            return 1
        spans: list[tuple[float, ...]] = []
        for i in range(inp["calls"]):
            t0 = _clocks()
            await sbx.write_file("f", "x", operation_id=f"c{i}")
            t1 = _clocks()
            spans.append(tuple(b - a for a, b in zip(t0, t1, strict=True)))
        MARKS["call"] = tuple(statistics.median(s[k] for s in spans[-200:]) for k in range(len(CLOCKS)))
        del spans
        MARKS["continue"] = _clocks()
        await ctx.continue_as_new({"phase": "next", "calls": inp["calls"]})
    return 0


class InlineCheckpoints:
    """The store as before: SQLite's automatic checkpoint (every 4,096 pages, inside the commit that passes it)."""

    @staticmethod
    def apply(store: SqliteStore) -> None:
        store._db.execute("PRAGMA wal_autocheckpoint=4096")
        store._db.execute(f"PRAGMA journal_size_limit={16 * 1024 * 1024}")
        store.checkpoints.after_commit = lambda db: None  # type: ignore[method-assign]


def _timed_state_of() -> None:
    """Time ``state_of`` of the ending run (the first of the chain) where ``RunExecutor.drive`` calls it."""
    inner = executor_module.state_of

    def timed(run: Any, rows: Any, reader: Any = None) -> Any:
        t0 = _clocks()
        state = inner(run, rows, reader) if reader is not None else inner(run, rows)
        t1 = _clocks()
        if run.run_id == "long":
            MARKS["state"] = tuple(b - a for a, b in zip(t0, t1, strict=True))
        return state

    executor_module.state_of = timed  # type: ignore[assignment]


def once(calls: int, base: str | None, way: str = "now") -> dict[str, dict[str, float]]:
    """One round one way: seconds by clock (``wall``, ``cpu``) of each of :data:`KEYS`."""

    async def go(d: Path) -> dict[str, dict[str, float]]:
        store = SqliteStore(d / "runs.db")
        if way == "inline":
            InlineCheckpoints.apply(store)
        engine = durable_sandbox.Engine(store, providers={"local": LocalProvider(d / "home")})
        MARKS.clear()
        state = await engine.run(long_session, {"phase": "first", "calls": calls}, run_id="long")
        assert state.status == "succeeded" and state.run_id == "long~1", (state.status, state.error)
        await engine.aclose()
        await store.close()
        out: dict[str, dict[str, float]] = {}
        for i, clock in enumerate(CLOCKS):
            call = MARKS["call"][i]
            handover = MARKS["next_first_call_done"][i] - MARKS["continue"][i] - call
            ending = MARKS["state"][i] if "state" in MARKS else 0.0
            out[clock] = {"call": call, "handover": handover, "ending_state": ending,
                          "handover_proper": handover - ending}
        return out

    with fresh_dir("continue", base) as d:
        return asyncio.run(go(d))


def _median(samples: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {clock: {k: statistics.median(s[clock][k] for s in samples) for k in KEYS} for clock in CLOCKS}


def _ratios(med: dict[str, dict[str, float]]) -> dict[str, float | None]:
    return {clock: ratio(med[clock]["handover"], med[clock]["call"]) for clock in CLOCKS}


def _table(title: str, by_calls: dict[int, dict[str, dict[str, dict[str, float]]]]) -> None:
    rows = []
    for calls, ways in by_calls.items():
        for way in ("now", "inline"):
            med = ways[way]
            for label, k in (("one call", "call"), ("the hand-over", "handover")):
                row = [f"{calls:,}", way, label]
                for clock in CLOCKS:
                    row += [fmt(med[clock][k] * 1e3, digits=2), fmt(ratio(med[clock][k], med[clock]["call"]), "x", 1)]
                rows.append(row)
    print_table(title, ["calls", "way", "what", "wall ms", "÷ call", "cpu ms", "÷ call", "loop cpu ms", "÷ call"],
                rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, nargs="+", default=[9_000, 10_000, 11_000],
                    help="calls of the session before it continues, one or more lengths (9,000 10,000 11,000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="directory for the temp stores (default: system temp)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "continue_as_new.json"))
    args = ap.parse_args(argv)
    _timed_state_of()
    samples: dict[int, dict[str, list[dict[str, dict[str, float]]]]] = {
        n: {"now": [], "inline": []} for n in args.calls}
    for round_no in range(args.rounds):
        for n in args.calls:
            print(f"round {round_no + 1} of {args.rounds}, {n} calls, now and inline ...", flush=True)
            for way in ("now", "inline"):
                samples[n][way].append(once(n, args.tmp, way))
    by_calls = {n: {way: _median(samples[n][way]) for way in ("now", "inline")} for n in args.calls}
    res: dict[str, Any] = {
        "machine": machine_info(),
        "params": vars(args),
        "samples_seconds": {str(n): samples[n] for n in args.calls},
        "median_seconds": {str(n): by_calls[n] for n in args.calls},
        "ratios": {str(n): {way: _ratios(by_calls[n][way]) for way in ("now", "inline")} for n in args.calls},
    }
    res["targets_met"] = {str(n): {clock: (r or 0) <= 5 for clock, r in res["ratios"][str(n)]["now"].items()}
                          for n in args.calls}
    _table(f"Continue-as-new vs one call (median of {args.rounds}; inline = SQLite's checkpoint inside a commit, "
           f"as before; same run)", by_calls)
    print("hand-over ÷ a call:", res["ratios"])
    print("targets met (within 5x):", res["targets_met"])
    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
