"""Durable step throughput and crash-resume (replay) time: durable-sandbox vs LangGraph vs DBOS.

    python benchmarks/engine_steps.py                 # full run, writes benchmarks/results/engine_steps.json
    python benchmarks/engine_steps.py --steps 500 --repeats 3 --no-dbos

Every system runs in this one process, one after another, each measurement in a fresh temp dir, with
warm-up runs discarded and the median of ``--repeats`` reported. See docs/benchmarks.md for the method.

Throughput: a workflow of N sequential no-op steps; each step's result is journaled before the next
step starts. Replay: a run whose N steps are all committed but whose workflow never returned (the
process died), driven to completion again: every step must come from the journal, none re-executed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    LG_SYNCHRONOUS,
    RESULTS_DIR,
    error_info,
    fmt,
    fresh_dir,
    lg_async_saver,
    lg_sync_conn,
    machine_info,
    print_table,
    ratio,
    repeat,
    sqlite_bytes,
    write_results,
)
from durable_sandbox.engine import Engine, workflow
from durable_sandbox.stores import SqliteStore

CHILD_LEASE_TTL = 0.5  # the crashed child's lease; the resuming worker waits it out, untimed
CALLS = {"n": 0}  # step executions, to prove a replay re-executes nothing


async def noop(i: int) -> int:
    CALLS["n"] += 1
    return i


def noop_sync(i: int) -> int:
    CALLS["n"] += 1
    return i


@workflow(name="bench.engine_steps")
async def steps_wf(ctx: Any, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", noop, i)
    return n


@workflow(name="bench.engine_steps_sync")
async def steps_sync_wf(ctx: Any, n: int) -> int:
    """The same with a plain (sync) step function, the kind most users write."""
    for i in range(n):
        await ctx.step(f"s{i}", noop_sync, i)
    return n


# ---------------------------------------------------------------------------------------- this engine


def engine_throughput_once(n: int, *, durability: str = "process", base: str | None = None, sync: bool = False) -> float:
    async def go(db: Path) -> float:
        store = SqliteStore(db, durability=durability)  # type: ignore[arg-type]
        engine = Engine(store)
        t0 = time.perf_counter()
        state = await engine.run(steps_sync_wf if sync else steps_wf, n, run_id="r1")
        dt = time.perf_counter() - t0
        assert state.status == "succeeded" and state.result == n, state.status
        await store.close()
        return dt

    with fresh_dir("engine", base) as d:
        return asyncio.run(go(d / "engine.db"))


def _crash_child(db: str, n: int) -> None:
    """Child process: run the workflow; DURABLE_SANDBOX_FAULT=after:s<n-1> SIGKILLs it right after the
    last step's commit, before the workflow returns and the run is marked succeeded."""

    async def go() -> None:
        await Engine(SqliteStore(db), lease_ttl=CHILD_LEASE_TTL).run(steps_wf, n, run_id="crashed")

    asyncio.run(go())
    sys.exit(3)  # the fault point did not fire


def make_crashed_engine_run(db: Path, n: int) -> None:
    env = dict(os.environ, DURABLE_SANDBOX_FAULT=f"after:s{n - 1}")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--crash-child", str(db), str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"crash child exited {proc.returncode}, not SIGKILL: {proc.stderr[-2000:]}")


def engine_replay_once(n: int, *, base: str | None = None, profile: cProfile.Profile | None = None) -> float:
    async def go(db: Path) -> float:
        store = SqliteStore(db)
        run = await store.get_run("crashed")
        assert run is not None and run.status == "running", run
        journal = await store.load_journal("crashed")
        assert sum(1 for r in journal if r.status == "completed") == n
        if run.lease_expires_at is not None:  # a dead worker's lease: wait it out (not timed)
            await asyncio.sleep(max(0.0, run.lease_expires_at - time.time()) + 0.05)
        engine = Engine(store)
        CALLS["n"] = 0
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        state = await engine.resume("crashed")
        dt = time.perf_counter() - t0
        if profile is not None:
            profile.disable()
        assert state.status == "succeeded" and state.result == n, state.status
        assert CALLS["n"] == 0, f"replay re-executed {CALLS['n']} steps"
        await store.close()
        return dt

    with fresh_dir("engine-replay", base) as d:
        make_crashed_engine_run(d / "engine.db", n)
        return asyncio.run(go(d / "engine.db"))


def bench_engine(steps: int, repeats: int, warmup: int, base: str | None = None, durability: str = "process",
                 sync: bool = False) -> dict[str, Any]:
    t = repeat(lambda warm: engine_throughput_once(max(steps // 4, 1) if warm else steps, durability=durability, base=base,
                                                   sync=sync), repeats, warmup)
    return {"steps": steps, "seconds": t, "steps_per_s": steps / t["median"], "durability": durability,
            "step_function": "sync" if sync else "async"}


def bench_engine_replay(steps: int, repeats: int, warmup: int, base: str | None = None) -> dict[str, Any]:
    t = repeat(lambda warm: engine_replay_once(steps, base=base), repeats, warmup)
    return {"steps": steps, "seconds": t, "replay_ms": t["median"] * 1000}


# ---------------------------------------------------------------------------------------- LangGraph


def _lg_build(checkpointer: Any, *, is_async: bool, crash: dict[str, bool] | None = None) -> Any:
    from langgraph.func import entrypoint, task

    if is_async:

        @task
        async def lg_noop(i: int) -> int:
            CALLS["n"] += 1
            return i

        @entrypoint(checkpointer=checkpointer)
        async def lg_wf(n: int) -> int:
            for i in range(n):
                await lg_noop(i)
            if crash is not None and crash["on"]:
                raise RuntimeError("simulated crash after the last task")
            return n

        return lg_wf

    @task
    def lg_noop_sync(i: int) -> int:
        CALLS["n"] += 1
        return i

    @entrypoint(checkpointer=checkpointer)
    def lg_wf_sync(n: int) -> int:
        for i in range(n):
            lg_noop_sync(i).result()
        if crash is not None and crash["on"]:
            raise RuntimeError("simulated crash after the last task")
        return n

    return lg_wf_sync


def lg_throughput_once(n: int, *, is_async: bool, durability: str = "sync", synchronous: str = "FULL", base: str | None = None) -> float:
    cfg = {"configurable": {"thread_id": "t1"}}
    with fresh_dir("langgraph", base) as d:
        db = d / "lg.db"
        if is_async:
            async def go() -> float:
                async with lg_async_saver(db, synchronous) as saver:
                    wf = _lg_build(saver, is_async=True)
                    t0 = time.perf_counter()
                    out = await wf.ainvoke(n, cfg, durability=durability)
                    dt = time.perf_counter() - t0
                    assert out == n
                    return dt

            return asyncio.run(go())
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = lg_sync_conn(db, synchronous)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            wf = _lg_build(saver, is_async=False)
            t0 = time.perf_counter()
            out = wf.invoke(n, cfg, durability=durability)
            dt = time.perf_counter() - t0
            assert out == n
            return dt
        finally:
            conn.close()


def lg_replay_once(n: int, *, is_async: bool, synchronous: str = "FULL", base: str | None = None) -> float:
    """First invocation fails on the entrypoint's last line after all n tasks completed; the timed second
    invocation on the same thread (input None) must take every task result from the checkpoint."""
    cfg = {"configurable": {"thread_id": "t1"}}
    crash = {"on": True}
    with fresh_dir("langgraph-replay", base) as d:
        db = d / "lg.db"
        if is_async:
            async def go() -> float:
                async with lg_async_saver(db, synchronous) as saver:
                    wf = _lg_build(saver, is_async=True, crash=crash)
                    try:
                        await wf.ainvoke(n, cfg)
                        raise AssertionError("the first invocation should have failed")
                    except RuntimeError:
                        pass
                    crash["on"] = False
                    CALLS["n"] = 0
                    t0 = time.perf_counter()
                    out = await wf.ainvoke(None, cfg)
                    dt = time.perf_counter() - t0
                    assert out == n and CALLS["n"] == 0, (out, CALLS["n"])
                    return dt

            return asyncio.run(go())
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = lg_sync_conn(db, synchronous)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            wf = _lg_build(saver, is_async=False, crash=crash)
            try:
                wf.invoke(n, cfg)
                raise AssertionError("the first invocation should have failed")
            except RuntimeError:
                pass
            crash["on"] = False
            CALLS["n"] = 0
            t0 = time.perf_counter()
            out = wf.invoke(None, cfg)
            dt = time.perf_counter() - t0
            assert out == n and CALLS["n"] == 0, (out, CALLS["n"])
            return dt
        finally:
            conn.close()


def _lg_throughput_run(steps: int, is_async: bool, synchronous: str, base: str | None, warm: bool) -> float:
    n = max(steps // 4, 1) if warm else steps
    return lg_throughput_once(n, is_async=is_async, durability="sync", synchronous=synchronous, base=base)


def _lg_replay_run(steps: int, is_async: bool, synchronous: str, base: str | None, warm: bool) -> float:
    return lg_replay_once(steps, is_async=is_async, synchronous=synchronous, base=base)


# (label, async API?, sqlite synchronous pragma); LangGraph's durability is "sync" throughout (every
# checkpoint persisted before the next superstep; task results go through put_writes either way).
LG_VARIANTS = [
    (f"{api} API, synchronous={sync}", api == "async", sync) for sync in LG_SYNCHRONOUS for api in ("sync", "async")
]


def bench_langgraph(steps: int, repeats: int, warmup: int, base: str | None = None) -> dict[str, Any]:
    variants: dict[str, Any] = {}
    for label, is_async, synchronous in LG_VARIANTS:
        try:
            t = repeat(partial(_lg_throughput_run, steps, is_async, synchronous, base), repeats, warmup)
            variants[label] = {"seconds": t, "steps_per_s": steps / t["median"]}
        except Exception as exc:
            variants[label] = error_info(exc)
    ok = {k: v for k, v in variants.items() if "steps_per_s" in v}
    best = max(ok, key=lambda k: ok[k]["steps_per_s"]) if ok else None
    return {
        "steps": steps,
        "variants": variants,
        "best": best,
        "steps_per_s": ok[best]["steps_per_s"] if best else None,
    }


def bench_langgraph_replay(steps: int, repeats: int, warmup: int, base: str | None = None) -> dict[str, Any]:
    variants: dict[str, Any] = {}
    for label, is_async, synchronous in LG_VARIANTS:
        try:
            t = repeat(partial(_lg_replay_run, steps, is_async, synchronous, base), repeats, warmup)
            variants[label] = {"seconds": t, "replay_ms": t["median"] * 1000}
        except Exception as exc:
            variants[label] = error_info(exc)
    ok = {k: v for k, v in variants.items() if "replay_ms" in v}
    best = min(ok, key=lambda k: ok[k]["replay_ms"]) if ok else None
    return {"steps": steps, "variants": variants, "best": best, "replay_ms": ok[best]["replay_ms"] if best else None}


# ---------------------------------------------------------------------------------------- DBOS


def _dbos_wal_engine(url: str) -> Any:
    """DBOS's own sqlite engine settings (IMMEDIATE transactions, busy timeout, foreign keys) plus
    WAL + synchronous=NORMAL, i.e. the same durability class as this engine's default."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


def dbos_steps(config: dict[str, Any], steps: int, repeats: int, warmup: int) -> dict[str, Any]:
    """A @DBOS.workflow calling a @DBOS.step ``steps`` times, timed as ours; ``config`` is DBOS's (which
    system database). All repeats share that database, on distinct workflow ids."""
    from dbos import DBOS, SetWorkflowID

    DBOS(config=config)  # type: ignore[arg-type]

    @DBOS.step()
    def dbos_noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def dbos_wf(n: int) -> int:
        for i in range(n):
            dbos_noop(i)
        return n

    DBOS.launch()
    try:
        counter = {"k": 0}

        def once(warm: bool) -> float:
            n = max(steps // 4, 1) if warm else steps
            counter["k"] += 1
            with SetWorkflowID(f"bench-{counter['k']}"):
                t0 = time.perf_counter()
                out = dbos_wf(n)
                dt = time.perf_counter() - t0
            assert out == n
            return dt

        t = repeat(once, repeats, warmup)
    finally:
        DBOS.destroy(destroy_registry=True)
    return {"seconds": t, "steps_per_s": steps / t["median"]}


def bench_dbos_variant(steps: int, repeats: int, warmup: int, *, wal: bool, base: str | None = None) -> dict[str, Any]:
    with fresh_dir("dbos", base) as d:
        url = f"sqlite:///{d / 'dbos.sqlite'}"
        config: dict[str, Any] = {"name": "dsb-bench", "system_database_url": url, "log_level": "WARNING"}
        if wal:
            config["system_database_engine"] = _dbos_wal_engine(url)
        out = dbos_steps(config, steps, repeats, warmup)
        out["store_bytes"] = sqlite_bytes(d / "dbos.sqlite")
    return out


def bench_dbos(steps: int, repeats: int, warmup: int, base: str | None = None) -> dict[str, Any]:
    variants: dict[str, Any] = {}
    for label, wal in (("sqlite, DBOS defaults (rollback journal, synchronous=FULL)", False), ("sqlite, WAL + synchronous=NORMAL engine", True)):
        try:
            variants[label] = bench_dbos_variant(steps, repeats, warmup, wal=wal, base=base)
        except Exception as exc:
            variants[label] = error_info(exc)
    default = variants[next(iter(variants))]
    return {
        "steps": steps,
        "variants": variants,
        "note": "All repeats of one variant share one DBOS system database (distinct workflow ids); "
        "the store is fresh per variant.",
        "steps_per_s": default.get("steps_per_s"),
    }


# ---------------------------------------------------------------------------------------- profiling


def profile_engine(steps: int, replay_steps: int, base: str | None = None, top: int = 30) -> dict[str, str]:
    out: dict[str, str] = {}
    prof = cProfile.Profile()

    async def go(db: Path) -> None:
        store = SqliteStore(db)
        prof.enable()
        await Engine(store).run(steps_wf, steps, run_id="p1")
        prof.disable()
        await store.close()

    with fresh_dir("profile", base) as d:
        asyncio.run(go(d / "engine.db"))
    for key, p in (("throughput", prof),):
        s = io.StringIO()
        pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(top)
        out[key] = s.getvalue()
    rprof = cProfile.Profile()
    engine_replay_once(replay_steps, base=base, profile=rprof)
    s = io.StringIO()
    pstats.Stats(rprof, stream=s).sort_stats("tottime").print_stats(top)
    out["replay"] = s.getvalue()
    return out


# ---------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000, help="steps per throughput run (default 3000)")
    ap.add_argument("--replay-steps", type=int, default=2000, help="steps of the run resumed by replay")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--slow-repeats", type=int, default=3, help="repeats for the fsync-bound rows (ours with fsync, DBOS)")
    ap.add_argument("--no-langgraph", action="store_true")
    ap.add_argument("--no-dbos", action="store_true")
    ap.add_argument("--profile", action="store_true", help="always write a cProfile of the engine")
    ap.add_argument("--tmp", default=None, help="directory for the temp stores (default: system temp)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "engine_steps.json"))
    ap.add_argument("--crash-child", nargs=2, metavar=("DB", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.crash_child:
        _crash_child(args.crash_child[0], int(args.crash_child[1]))
        return {}

    base = args.tmp
    res: dict[str, Any] = {"machine": machine_info(), "params": vars(args) | {"crash_child": None}}
    print(f"engine: {args.steps} steps x {args.repeats} (+{args.warmup} warm-up) ...", flush=True)
    res["engine"] = bench_engine(args.steps, args.repeats, args.warmup, base)
    res["engine_sync"] = bench_engine(args.steps, args.repeats, args.warmup, base, sync=True)
    res["engine_fsync"] = bench_engine(args.steps, args.slow_repeats, args.warmup, base, durability="fsync")
    print(f"engine replay: {args.replay_steps} steps ...", flush=True)
    res["engine_replay"] = bench_engine_replay(args.replay_steps, args.repeats, args.warmup, base)

    if not args.no_langgraph:
        try:
            import langgraph.checkpoint.sqlite
            import langgraph.func  # noqa: F401

            print("langgraph ...", flush=True)
            res["langgraph"] = bench_langgraph(args.steps, args.repeats, args.warmup, base)
            res["langgraph_replay"] = bench_langgraph_replay(args.replay_steps, args.repeats, args.warmup, base)
        except ImportError as exc:
            res["langgraph"] = res["langgraph_replay"] = error_info(exc)
    if not args.no_dbos:
        try:
            import dbos  # noqa: F401

            print("dbos ...", flush=True)
            res["dbos"] = bench_dbos(args.steps, args.slow_repeats, args.warmup, base)
        except ImportError as exc:
            res["dbos"] = error_info(exc)

    eng = res["engine"]["steps_per_s"]
    lg = res.get("langgraph", {}).get("steps_per_s")
    db = res.get("dbos", {}).get("steps_per_s")
    dbos_wal = (res.get("dbos", {}).get("variants") or {}).get("sqlite, WAL + synchronous=NORMAL engine", {}).get("steps_per_s")
    rep = res["engine_replay"]["replay_ms"]
    lg_rep = res.get("langgraph_replay", {}).get("replay_ms")
    lg_vars = res.get("langgraph", {}).get("variants") or {}
    lg_full = max((v.get("steps_per_s") or 0 for k, v in lg_vars.items() if k.endswith("synchronous=FULL")), default=None)
    lgr_vars = res.get("langgraph_replay", {}).get("variants") or {}
    lgr_full = min((v["replay_ms"] for k, v in lgr_vars.items() if k.endswith("synchronous=FULL") and "replay_ms" in v), default=None)
    eng_sync = res["engine_sync"]["steps_per_s"]
    res["ratios"] = {
        "throughput_vs_langgraph": ratio(eng, lg),
        "sync_throughput_vs_langgraph": ratio(eng_sync, lg),
        "sync_vs_async_steps": ratio(eng_sync, eng),
        "throughput_vs_langgraph_shipped_sqlite_settings": ratio(eng, lg_full or None),
        "replay_speedup_vs_langgraph_shipped_sqlite_settings": ratio(lgr_full, rep),
        "throughput_vs_dbos_default": ratio(eng, db),
        "throughput_vs_dbos_wal": ratio(eng, dbos_wal),
        "fsync_throughput_vs_dbos_default": ratio(res["engine_fsync"]["steps_per_s"], db),
        "replay_speedup_vs_langgraph": ratio(lg_rep, rep),
    }
    targets = {
        "throughput_10x_langgraph": None if lg is None else res["ratios"]["throughput_vs_langgraph"] >= 10,
        "sync_throughput_10x_langgraph": None if lg is None else res["ratios"]["sync_throughput_vs_langgraph"] >= 10,
        "replay_10x_langgraph": None if lg_rep is None else res["ratios"]["replay_speedup_vs_langgraph"] >= 10,
    }
    res["targets_met"] = targets

    if args.profile or any(v is False for v in targets.values()):
        print("profiling the engine ...", flush=True)
        res["profile"] = profile_engine(args.steps, args.replay_steps, base)
        prof_path = Path(args.out).with_name("engine_steps_profile.txt")
        prof_path.parent.mkdir(parents=True, exist_ok=True)
        prof_path.write_text("".join(f"==== {k}\n{v}\n" for k, v in res["profile"].items()))
        print(f"profile written to {prof_path}")

    rows = [
        ["durable-sandbox (durability=process, default)", fmt(eng, digits=0), "1.0x"],
        ["durable-sandbox, sync step function", fmt(eng_sync, digits=0), fmt(ratio(eng_sync, eng), "x", 2)],
        ["durable-sandbox (durability=fsync)", fmt(res["engine_fsync"]["steps_per_s"], digits=0), fmt(ratio(res["engine_fsync"]["steps_per_s"], eng), "x", 2)],
    ]
    for label, v in (res.get("langgraph", {}).get("variants") or {}).items():
        rows.append([f"LangGraph functional, {label}", fmt(v.get("steps_per_s"), digits=0) if "steps_per_s" in v else v.get("error", "")[:60], fmt(ratio(v.get("steps_per_s"), eng), "x", 3)])
    for label, v in (res.get("dbos", {}).get("variants") or {}).items():
        rows.append([f"DBOS {label}", fmt(v.get("steps_per_s"), digits=0) if "steps_per_s" in v else v.get("error", "")[:60], fmt(ratio(v.get("steps_per_s"), eng), "x", 3)])
    print_table(f"Durable no-op steps/s ({args.steps} steps, median of {args.repeats}; fsync-bound rows {args.slow_repeats})", ["system", "steps/s", "vs ours"], rows)
    rrows = [["durable-sandbox resume (SIGKILLed child, replay)", fmt(rep, " ms"), "1.0x"]]
    for label, v in (res.get("langgraph_replay", {}).get("variants") or {}).items():
        rrows.append([f"LangGraph re-invoke after failure, {label}", fmt(v.get("replay_ms"), " ms") if "replay_ms" in v else v.get("error", "")[:60], fmt(ratio(v.get("replay_ms"), rep), "x", 1)])
    print_table(f"Resume of a {args.replay_steps}-step run through replay (median of {args.repeats})", ["system", "time", "vs ours"], rrows)
    print("\nratios:", json.dumps(res["ratios"], indent=1))
    print("targets met:", targets)

    write_results(res, Path(args.out))
    return res


if __name__ == "__main__":
    main()
