"""benchmarks/engine_postgres.py at a tiny size on the session's server, so it does not rot (the figures mean
nothing at this size; docs/benchmarks.md has the real ones)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from tests.postgres.server import PostgresServer

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def test_engine_postgres_benchmark_runs_every_configuration(postgres_server: PostgresServer, tmp_path: Path) -> None:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    mod = importlib.import_module("engine_postgres")
    res = mod.measure(postgres_server, tmp_path, steps=8, repeats=1, warmup=0, dbos=False, profile=True,
                      runs_at_once=4)
    for key in ("sqlite_process", "sqlite_fsync", "postgres", "postgres_async_commit"):
        assert res[key]["steps_per_s"] > 0 and res[key + "_sync"]["steps_per_s"] > 0
        assert res[key + "_4_runs"]["steps_per_s"] > 0 and res[key + "_4_runs"]["runs_at_once"] == 4
    assert res["ratios"]["postgres_vs_sqlite_process"] > 0
    assert "function calls" in res["profile_postgres"]
