"""Fan-out, callbacks and store growth: durable-sandbox vs LangGraph's Functional API with SqliteSaver.

    python benchmarks/engine_parallel.py              # full run, writes benchmarks/results/engine_parallel.json

1. fan-out: one workflow runs 1,000 no-op steps in parallel (``ctx.parallel`` / 1,000 ``@task`` futures).
2. callbacks: a workflow waits on 100 callbacks in sequence, each delivered and resumed one by one
   (``engine.signal`` + ``engine.resume`` / ``invoke(Command(resume=...))`` after ``interrupt``).
3. growth: store size after N = 100, 1,000, 5,000 sequential no-op steps.

Wall time is the median of ``--repeats`` after a warm-up; every measurement uses a fresh temp dir.
Store size is reported twice: "live" = main file + WAL as they sit on disk when the flow finishes (the
brief's "incl. WAL"); "compacted" = after the connections are closed and the WAL is checkpointed and
truncated, i.e. the data that is really kept.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    LG_SYNCHRONOUS,
    RESULTS_DIR,
    compacted_bytes,
    error_info,
    fmt,
    fresh_dir,
    lg_async_saver,
    lg_sync_conn,
    machine_info,
    print_table,
    ratio,
    sqlite_bytes,
    summarize,
    write_results,
)
from durable_sandbox.engine import Engine, workflow
from durable_sandbox.stores import SqliteStore

CFG = {"configurable": {"thread_id": "t1"}}
LG_DURABILITY = "sync"


async def noop(i: int) -> int:
    return i


@workflow(name="bench.parallel.fanout")
async def fanout_wf(ctx: Any, n: int) -> int:
    out = await ctx.parallel("fan", {f"k{i}": partial(noop, i) for i in range(n)})
    return sum(out.values())


@workflow(name="bench.parallel.callbacks")
async def callbacks_wf(ctx: Any, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.callback(f"cb-{i}")
    return total


@workflow(name="bench.parallel.sequential")
async def sequential_wf(ctx: Any, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", noop, i)
    return n


# One measurement: returns (seconds, live bytes, compacted bytes).
Measure = tuple[float, int, int]


# ---------------------------------------------------------------------------------------- this engine


def _engine_flow(kind: str, n: int, base: str | None) -> Measure:
    async def go(db: Path) -> tuple[float, int]:
        store = SqliteStore(db)
        engine = Engine(store)
        t0 = time.perf_counter()
        if kind == "fanout":
            state = await engine.run(fanout_wf, n, run_id="r1")
        elif kind == "sequential":
            state = await engine.run(sequential_wf, n, run_id="r1")
        else:
            state = await engine.run(callbacks_wf, n, run_id="r1")
            for i in range(n):
                assert state.status == "waiting", state.status
                await engine.signal("r1", f"cb-{i}", i)
                state = await engine.resume("r1")
        dt = time.perf_counter() - t0
        expected = n if kind == "sequential" else n * (n - 1) // 2
        assert state.status == "succeeded" and state.result == expected, (state.status, state.result)
        live = sqlite_bytes(db)
        await store.close()
        return dt, live

    with fresh_dir(f"engine-{kind}", base) as d:
        dt, live = asyncio.run(go(d / "engine.db"))
        return dt, live, compacted_bytes(d / "engine.db")


# ---------------------------------------------------------------------------------------- LangGraph


def _lg_workflow(kind: str, checkpointer: Any, is_async: bool) -> Any:
    from langgraph.func import entrypoint, task
    from langgraph.types import interrupt

    if kind == "callbacks":
        # interrupt() is the same call in a sync or async entrypoint.
        if is_async:

            @entrypoint(checkpointer=checkpointer)
            async def lg_callbacks(n: int) -> int:
                total = 0
                for i in range(n):
                    total += interrupt(i)
                return total

            return lg_callbacks

        @entrypoint(checkpointer=checkpointer)
        def lg_callbacks_sync(n: int) -> int:
            total = 0
            for i in range(n):
                total += interrupt(i)
            return total

        return lg_callbacks_sync

    if is_async:

        @task
        async def lg_noop(i: int) -> int:
            return i

        @entrypoint(checkpointer=checkpointer)
        async def lg_flow(n: int) -> int:
            if kind == "fanout":
                return sum(await asyncio.gather(*(lg_noop(i) for i in range(n))))
            for i in range(n):
                await lg_noop(i)
            return n

        return lg_flow

    @task
    def lg_noop_sync(i: int) -> int:
        return i

    @entrypoint(checkpointer=checkpointer)
    def lg_flow_sync(n: int) -> int:
        if kind == "fanout":
            futures = [lg_noop_sync(i) for i in range(n)]
            return sum(f.result() for f in futures)
        for i in range(n):
            lg_noop_sync(i).result()
        return n

    return lg_flow_sync


def _lg_flow(kind: str, n: int, base: str | None, is_async: bool, synchronous: str = "FULL") -> Measure:
    from langgraph.types import Command

    expected = n if kind == "sequential" else n * (n - 1) // 2
    with fresh_dir(f"langgraph-{kind}", base) as d:
        db = d / "lg.db"
        if is_async:
            async def go() -> tuple[float, int]:
                async with lg_async_saver(db, synchronous) as saver:
                    wf = _lg_workflow(kind, saver, True)
                    t0 = time.perf_counter()
                    out = await wf.ainvoke(n, CFG, durability=LG_DURABILITY)
                    if kind == "callbacks":
                        for i in range(n):
                            out = await wf.ainvoke(Command(resume=i), CFG, durability=LG_DURABILITY)
                    dt = time.perf_counter() - t0
                    assert out == expected, out
                    return dt, sqlite_bytes(db)

            dt, live = asyncio.run(go())
        else:
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = lg_sync_conn(db, synchronous)
            try:
                saver = SqliteSaver(conn)
                saver.setup()
                wf = _lg_workflow(kind, saver, False)
                t0 = time.perf_counter()
                out = wf.invoke(n, CFG, durability=LG_DURABILITY)
                if kind == "callbacks":
                    for i in range(n):
                        out = wf.invoke(Command(resume=i), CFG, durability=LG_DURABILITY)
                dt = time.perf_counter() - t0
                assert out == expected, out
                live = sqlite_bytes(db)
            finally:
                conn.close()
        return dt, live, compacted_bytes(db)


# ---------------------------------------------------------------------------------------- measuring


def measure(flow: Callable[[int], Measure], n: int, repeats: int, warmup: int) -> dict[str, Any]:
    for _ in range(warmup):
        flow(max(n // 4, 1))
    runs = [flow(n) for _ in range(repeats)]
    return {
        "n": n,
        "seconds": summarize([r[0] for r in runs]),
        "live_bytes": runs[-1][1],
        "compacted_bytes": runs[-1][2],
    }


def bench_engine(fanout: int, callbacks: int, repeats: int, warmup: int, base: str | None = None) -> dict[str, Any]:
    return {
        "fanout": measure(lambda n: _engine_flow("fanout", n, base), fanout, repeats, warmup),
        "callbacks": measure(lambda n: _engine_flow("callbacks", n, base), callbacks, repeats, warmup),
    }


def bench_engine_growth(sizes: list[int], base: str | None = None) -> dict[str, Any]:
    return {str(n): _size_row(_engine_flow("sequential", n, base), n) for n in sizes}


def _size_row(m: Measure, n: int) -> dict[str, Any]:
    return {"seconds": m[0], "live_bytes": m[1], "compacted_bytes": m[2], "compacted_bytes_per_step": m[2] / n}


def _lg_run(kind: str, base: str | None, is_async: bool, synchronous: str, n: int) -> Measure:
    return _lg_flow(kind, n, base, is_async, synchronous)


def bench_langgraph(fanout: int, callbacks: int, repeats: int, warmup: int, base: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, n in (("fanout", fanout), ("callbacks", callbacks)):
        variants: dict[str, Any] = {}
        for synchronous in LG_SYNCHRONOUS:
            for api in ("sync", "async"):
                label = f"{api} API, synchronous={synchronous}"
                try:
                    variants[label] = measure(partial(_lg_run, kind, base, api == "async", synchronous), n, repeats, warmup)
                except Exception as exc:
                    variants[label] = error_info(exc)
        ok = {k: v for k, v in variants.items() if "seconds" in v}
        best = min(ok, key=lambda k: ok[k]["seconds"]["median"]) if ok else None
        out[kind] = {"variants": variants, "best": best, **(ok[best] if best else {})}
    return out


def bench_langgraph_growth(sizes: list[int], base: str | None = None) -> dict[str, Any]:
    return {str(n): _size_row(_lg_flow("sequential", n, base, False, "NORMAL"), n) for n in sizes}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fanout", type=int, default=1000)
    ap.add_argument("--callbacks", type=int, default=100)
    ap.add_argument("--sizes", default="100,1000,5000", help="sequential step counts for the growth table")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-langgraph", action="store_true")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--out", default=str(RESULTS_DIR / "engine_parallel.json"))
    args = ap.parse_args(argv)
    base = args.tmp
    sizes = [int(s) for s in args.sizes.split(",") if s]

    res: dict[str, Any] = {"machine": machine_info(), "params": vars(args), "langgraph_durability": LG_DURABILITY}
    print("engine ...", flush=True)
    res["engine"] = bench_engine(args.fanout, args.callbacks, args.repeats, args.warmup, base)
    res["engine_growth"] = bench_engine_growth(sizes, base)
    if not args.no_langgraph:
        try:
            import langgraph.checkpoint.sqlite
            import langgraph.func  # noqa: F401

            print("langgraph ...", flush=True)
            res["langgraph"] = bench_langgraph(args.fanout, args.callbacks, args.repeats, args.warmup, base)
            res["langgraph_growth"] = bench_langgraph_growth(sizes, base)
        except ImportError as exc:
            res["langgraph"] = error_info(exc)

    lg = res.get("langgraph", {})
    ratios: dict[str, Any] = {}
    rows = []
    for kind, label in (("fanout", f"fan-out of {args.fanout} parallel steps"), ("callbacks", f"{args.callbacks} callbacks, signal+resume each")):
        ours = res["engine"][kind]
        theirs = lg.get(kind, {})
        t_ours = ours["seconds"]["median"]
        t_lg = (theirs.get("seconds") or {}).get("median")
        ratios[kind] = {
            "time_speedup_vs_langgraph": ratio(t_lg, t_ours),
            "live_size_ratio_langgraph_over_ours": ratio(theirs.get("live_bytes"), ours["live_bytes"]),
            "compacted_size_ratio_langgraph_over_ours": ratio(theirs.get("compacted_bytes"), ours["compacted_bytes"]),
        }
        rows.append([
            label,
            fmt(t_ours * 1000, " ms"),
            fmt(None if t_lg is None else t_lg * 1000, " ms") + (f" ({theirs.get('best')})" if theirs.get("best") else ""),
            fmt(ratios[kind]["time_speedup_vs_langgraph"], "x"),
            f"{ours['live_bytes']:,} / {ours['compacted_bytes']:,}",
            f"{theirs.get('live_bytes', 0):,} / {theirs.get('compacted_bytes', 0):,}",
            fmt(ratios[kind]["live_size_ratio_langgraph_over_ours"], "x", 2) + " / " + fmt(ratios[kind]["compacted_size_ratio_langgraph_over_ours"], "x", 2),
        ])
    print_table(
        f"Wall time (median of {args.repeats}) and store bytes (live incl. WAL / compacted)",
        ["flow", "ours", "LangGraph", "LG/ours time", "ours bytes", "LangGraph bytes", "LG/ours bytes"],
        rows,
    )
    grows = []
    growth_ratio: dict[str, Any] = {}
    for n in sizes:
        o = res["engine_growth"][str(n)]
        t = (res.get("langgraph_growth") or {}).get(str(n), {})
        growth_ratio[str(n)] = {
            "live": ratio(t.get("live_bytes"), o["live_bytes"]),
            "compacted": ratio(t.get("compacted_bytes"), o["compacted_bytes"]),
        }
        grows.append([
            f"{n:,}",
            f"{o['live_bytes']:,}",
            f"{o['compacted_bytes']:,}",
            fmt(o["compacted_bytes_per_step"], " B", 0),
            f"{t.get('live_bytes', 0):,}",
            f"{t.get('compacted_bytes', 0):,}",
            fmt(t.get("compacted_bytes_per_step"), " B", 0),
            fmt(growth_ratio[str(n)]["compacted"], "x", 2),
        ])
    ratios["growth_langgraph_over_ours"] = growth_ratio
    print_table(
        "Store size after N sequential steps",
        ["N", "ours live", "ours compacted", "ours/step", "LG live", "LG compacted", "LG/step", "LG/ours compacted"],
        grows,
    )
    res["ratios"] = ratios
    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
