"""Shared helpers for the benchmarks: timing with warm-up and repeats, sqlite file sizes, machine info."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def fresh_dir(prefix: str, base: str | None = None) -> Iterator[Path]:
    """A new empty temp directory, removed afterwards: every measurement starts from an empty store."""
    path = Path(tempfile.mkdtemp(prefix=f"dsb-bench-{prefix}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def summarize(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def repeat(once: Callable[[bool], float], repeats: int, warmup: int) -> dict[str, Any]:
    """Call ``once(warm)`` ``warmup`` times (discarded, warm=True) then ``repeats`` times; summarize seconds."""
    for _ in range(warmup):
        once(True)
    return summarize([once(False) for _ in range(repeats)])


def sqlite_bytes(db: Path) -> int:
    """Bytes of a sqlite database as it sits on disk now: main file + WAL (+ rollback journal if any)."""
    total = 0
    for suffix in ("", "-wal", "-journal"):
        p = Path(str(db) + suffix)
        if p.exists():
            total += p.stat().st_size
    return total


def compacted_bytes(db: Path) -> int:
    """Bytes after every writer is closed and the WAL is checkpointed into the main file and truncated."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return sqlite_bytes(db)


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "tmpdir": tempfile.gettempdir(),
        "versions": {
            name: dist_version(name)
            for name in (
                "durable-sandbox",
                "langgraph",
                "langgraph-checkpoint",
                "langgraph-checkpoint-sqlite",
                "dbos",
                "sqlalchemy",
            )
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def error_info(exc: BaseException) -> dict[str, Any]:
    return {
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exception(exc)[-6:],
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(x: float | None, unit: str = "", digits: int = 1) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}{unit}"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


# LangGraph's SqliteSaver sets journal_mode=WAL and leaves synchronous at SQLite's default (FULL: an fsync
# per commit). "NORMAL" is the same durability class as durable-sandbox's default (survives any process
# death, a power cut may lose the last commits); the benchmarks measure LangGraph both ways.
LG_SYNCHRONOUS = ("NORMAL", "FULL")


def lg_sync_conn(db: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(str(db), check_same_thread=False)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


@contextlib.asynccontextmanager
async def lg_async_saver(db: Path, synchronous: str) -> Any:
    """What ``AsyncSqliteSaver.from_conn_string`` does, plus the synchronous pragma."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(str(db))
    try:
        await conn.execute(f"PRAGMA synchronous={synchronous}")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        yield saver
    finally:
        await conn.close()


def write_results(res: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"results written to {out}")


def run_in_workdir(prefix: str, tmp: str | None, run: Callable[[Path], dict[str, Any]],
                   report: Callable[[dict[str, Any]], None], out: Path) -> None:
    """``run(workdir)`` in a fresh temp dir, then print and write its results. The dir is removed afterwards,
    unless the run failed: then its logs are what explains the failure, so it stays and its path is printed."""
    workdir = Path(tempfile.mkdtemp(prefix=f"dsb-bench-{prefix}-", dir=tmp))
    try:
        res = run(workdir)
    except BaseException:
        print(f"the run failed; its work dir (logs) is kept: {workdir}", flush=True)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    report(res)
    write_results(res, out)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """SIGTERM (a replica hands its work over), then SIGKILL if it has not exited within ``timeout`` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
