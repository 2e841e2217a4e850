"""Durable steps per second on PostgreSQL beside SQLite, and beside DBOS on the same PostgreSQL server.

    python benchmarks/engine_postgres.py                # writes benchmarks/results/engine_postgres.json
    python benchmarks/engine_postgres.py --steps 500 --repeats 3 --no-dbos --profile

What runs, in this one process and one invocation: a PostgreSQL server of its own (tests/postgres/server.py, with
PostgreSQL's default durability: every commit flushed to disk, as in production), then for each configuration a
workflow of N sequential no-op steps (each step's result journaled before the next starts), warm-up discarded,
the median of --repeats:

- SqliteStore, durability "process" (WAL, synchronous=NORMAL) and "fsync" (synchronous=FULL);
- PostgresStore on a database with PostgreSQL's defaults (synchronous_commit=on: a commit is on disk before it
  returns, the class of SQLite's "fsync") and on one with synchronous_commit=off (a commit survives any client
  crash and a clean server restart; a server crash may lose the last ~0.6 s: about SQLite's "process");
- DBOS (@DBOS.workflow calling a @DBOS.step N times) with its system database on the same server, defaults.

Async and sync step functions both: a quick sync step runs inline and commits once, an async one twice
(docs/architecture.md "Durability and the step path"), so the pair shows the cost of one commit.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.postgres.server import PostgresServer

from _common import (
    RESULTS_DIR,
    error_info,
    fmt,
    fresh_dir,
    machine_info,
    print_table,
    ratio,
    repeat,
    write_results,
)
from durable_sandbox.engine import Engine
from durable_sandbox.stores import SqliteStore
from durable_sandbox.stores.postgres import PostgresStore
from engine_steps import dbos_steps, steps_sync_wf, steps_wf


def _engine_once(open_store: Any, n: int, sync: bool, profile: cProfile.Profile | None = None, runs: int = 1) -> float:
    """Seconds for ``runs`` runs of ``n // runs`` steps each, all at once in this process."""
    async def go() -> float:
        store = await open_store()
        try:
            engine = Engine(store)
            tag = time.monotonic_ns()
            each = max(n // runs, 1)
            if profile is not None:
                profile.enable()
            t0 = time.perf_counter()
            states = await asyncio.gather(*(engine.run(steps_sync_wf if sync else steps_wf, each, run_id=f"r-{tag}-{i}")
                                            for i in range(runs)))
            dt = time.perf_counter() - t0
            if profile is not None:
                profile.disable()
            assert all(s.status == "succeeded" and s.result == each for s in states), [s.status for s in states]
            return dt
        finally:
            await store.close()

    return asyncio.run(go())


def bench(open_store: Any, steps: int, repeats: int, warmup: int, sync: bool, runs: int = 1) -> dict[str, Any]:
    t = repeat(lambda warm: _engine_once(open_store, max(steps // 4, runs) if warm else steps, sync, runs=runs),
               repeats, warmup)
    return {"steps": steps, "runs_at_once": runs, "seconds": t, "steps_per_s": steps / t["median"],
            "step_function": "sync" if sync else "async"}


def sqlite_opener(base: Path, durability: str) -> Any:
    counter = {"k": 0}

    async def open_store() -> SqliteStore:
        counter["k"] += 1  # a fresh file per measurement: every run starts from an empty store
        return SqliteStore(base / f"{durability}-{counter['k']}.db", durability=durability)  # type: ignore[arg-type]

    return open_store


def postgres_opener(dsn: str) -> Any:
    counter = {"k": 0}

    async def open_store() -> PostgresStore:
        counter["k"] += 1  # a fresh schema per measurement
        return await PostgresStore.connect(f"{dsn}?schema=bench_{counter['k']}")

    return open_store


def bench_dbos(dsn: str, steps: int, repeats: int, warmup: int) -> dict[str, Any]:
    out = dbos_steps({"name": "dsb-bench", "system_database_url": dsn, "log_level": "WARNING"}, steps, repeats, warmup)
    return {"steps": steps, **out, "step_function": "sync",
            "configuration": "system database on the same server, DBOS defaults"}


def profile_postgres(dsn: str, steps: int, top: int = 25) -> str:
    prof = cProfile.Profile()
    _engine_once(postgres_opener(dsn), steps, False, prof)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def measure(server: PostgresServer, workdir: Path, *, steps: int, repeats: int, warmup: int, dbos: bool,
            profile: bool, runs_at_once: int = 20) -> dict[str, Any]:
    """Every configuration against ``server`` (databases of this call's own on it), SQLite files in ``workdir``."""
    tag = time.strftime("%H%M%S")
    res: dict[str, Any] = {"steps": steps, "repeats": repeats, "postgres_version": server.sql("SHOW server_version").strip()}
    async_db = f"bench_async_commit_{tag}"
    server.sql(f"CREATE DATABASE {async_db}")
    server.sql(f"ALTER DATABASE {async_db} SET synchronous_commit = off")
    configs = {
        "sqlite_process": sqlite_opener(workdir, "process"),
        "sqlite_fsync": sqlite_opener(workdir, "fsync"),
        "postgres": postgres_opener(server.dsn()),
        "postgres_async_commit": postgres_opener(server.dsn(async_db)),
    }
    for sync in (False, True):
        for name, opener in configs.items():
            key = name + ("_sync" if sync else "")
            print(f"{key} ...", flush=True)
            res[key] = bench(opener, steps, repeats, warmup, sync)
    for name in ("sqlite_process", "sqlite_fsync", "postgres", "postgres_async_commit"):
        key = f"{name}_{runs_at_once}_runs"
        print(f"{key} ...", flush=True)
        res[key] = bench(configs[name], steps, repeats, warmup, False, runs=runs_at_once)
    if dbos:
        print("dbos on postgres ...", flush=True)
        try:
            server.sql(f"CREATE DATABASE dbos_bench_{tag}")
            res["dbos_postgres"] = bench_dbos(server.dsn(f"dbos_bench_{tag}"), steps, repeats, warmup)
        except Exception as exc:
            res["dbos_postgres"] = error_info(exc)
    if profile:
        res["profile_postgres"] = profile_postgres(server.dsn(), steps)

    def sps(key: str) -> float | None:
        value = res.get(key, {}).get("steps_per_s")
        return float(value) if value is not None else None

    res["ratios"] = {
        "postgres_vs_sqlite_process": ratio(sps("postgres"), sps("sqlite_process")),
        "postgres_vs_sqlite_fsync": ratio(sps("postgres"), sps("sqlite_fsync")),
        "postgres_async_commit_vs_sqlite_process": ratio(sps("postgres_async_commit"), sps("sqlite_process")),
        "postgres_sync_vs_sqlite_process_sync": ratio(sps("postgres_sync"), sps("sqlite_process_sync")),
        "postgres_vs_sqlite_process_many_runs": ratio(sps(f"postgres_{runs_at_once}_runs"),
                                                      sps(f"sqlite_process_{runs_at_once}_runs")),
        "postgres_vs_sqlite_fsync_many_runs": ratio(sps(f"postgres_{runs_at_once}_runs"),
                                                    sps(f"sqlite_fsync_{runs_at_once}_runs")),
        "postgres_many_runs_vs_one": ratio(sps(f"postgres_{runs_at_once}_runs"), sps("postgres")),
        "postgres_vs_dbos_postgres": ratio(sps("postgres"), sps("dbos_postgres")),
        "postgres_sync_vs_dbos_postgres": ratio(sps("postgres_sync"), sps("dbos_postgres")),
    }
    rows = [[key, res[key]["step_function"], str(res[key].get("runs_at_once", 1)), fmt(sps(key))]
            for key in res if isinstance(res[key], dict) and "steps_per_s" in res[key]]
    print_table(f"durable no-op steps/s ({steps} steps, median of {repeats})",
                ["configuration", "step fn", "runs at once", "steps/s"], rows)
    for name, value in res["ratios"].items():
        print(f"{name}: {fmt(value, 'x', 2)}")
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--runs-at-once", type=int, default=20, help="the concurrent rows: this many runs share --steps")
    ap.add_argument("--no-dbos", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile of the async PostgreSQL run (in the JSON)")
    ap.add_argument("--tmp", default=None, help="directory for the stores and the server")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "engine_postgres.json")
    args = ap.parse_args(argv)
    with fresh_dir("pg", args.tmp) as d:
        d.chmod(0o711)  # the server runs as the postgres user: it must be able to enter its directory
        server = PostgresServer(d / "server", durable=True).up()
        try:
            res = {"machine": machine_info(), **measure(server, d, steps=args.steps, repeats=args.repeats,
                                                        warmup=args.warmup, dbos=not args.no_dbos,
                                                        profile=args.profile, runs_at_once=args.runs_at_once)}
        finally:
            server.down(purge=True)
    write_results(res, args.out)
    return res


if __name__ == "__main__":
    main()
