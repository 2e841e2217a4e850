"""Driving tests/unit/crash_worker.py in a child process that a fault point SIGKILLs, and reading back what the
database file (not the engine's word) says was committed: shared by the crash-safety and nondeterminism tests."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path

from tests.unit import crash_worker  # importing it registers the crash-* workflows here

WORKER = Path(crash_worker.__file__)
LEASE_TTL = 30  # crash_worker's lease


async def _child(*args, fault=None, die_in=None, skew=None):
    env = dict(os.environ)
    for key, value in (
        ("DURABLE_SANDBOX_FAULT", fault),
        ("CRASH_WORKER_DIE_IN", die_in),
        ("CRASH_WORKER_CLOCK_SKEW", skew),
    ):
        if value is not None:
            env[key] = str(value)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        *map(str, args),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


def _committed(db_path, run_id):
    """Step ids whose completion is in the database file (not the engine's word: the file's)."""
    con = sqlite3.connect(db_path)
    try:
        rows = con.execute(
            "SELECT op_id FROM ops WHERE run_id=? AND status='completed' ORDER BY seq", (run_id,)
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


def _log(path):
    return path.read_text().split() if path.exists() else []


async def _crash(db_path, run_id, workflow, log, **kw):
    code, out, err = await _child("run", db_path, run_id, workflow, log, **kw)
    assert code == -signal.SIGKILL, (code, out, err)
    assert out == ""  # died before reporting
    return _committed(db_path, run_id)
