"""Workflows the PostgreSQL tests run by reference (tests.postgres.flows:<name>), in-process and in `dsb` processes.

Every step appends ``<run> <step> <pid>`` to the log file the input names (O_APPEND: one line per write, from any
process), so a test sees each execution of a step's body: a step done twice, by one worker or two, shows twice.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import durable_sandbox

SHARE_DEADLINE_S = 60.0


def _record(log: str, run: str, step: int) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{run} {step} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return step


def _record_and_share(log: str, run: str, step: int) -> int:
    """Record, then wait (with a deadline) until a second process has recorded too: the runs are known to
    be spread over two workers, not drained by the first one to start."""
    _record(log, run, step)
    deadline = time.monotonic() + SHARE_DEADLINE_S
    while len({line.split()[2] for line in Path(log).read_text().splitlines()}) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("no second worker executed a step within the deadline")
        time.sleep(0.02)
    return step


def _stop_server_once(server_dir: str, marker: str) -> str:
    """Stop the test server (tests/postgres/server.py) the first time only: a step whose result could not be
    committed runs again when the run is resumed, and must not stop the server again then."""
    from tests.postgres.server import PostgresServer

    if not Path(marker).exists():
        Path(marker).write_text("stopped")
        PostgresServer(Path(server_dir)).stop()
    return "stopped"


@durable_sandbox.workflow
async def stops_the_server(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    first = await ctx.step("before", _record, data["log"], ctx.run_id, 0)
    await ctx.step("stop", _stop_server_once, data["server"], data["marker"])
    after = await ctx.step("after", _record, data["log"], ctx.run_id, 2)
    return {"steps": [first, after]}


def _wait_for_file(path: str) -> str:
    deadline = time.monotonic() + SHARE_DEADLINE_S
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within the deadline")
        time.sleep(0.02)
    return Path(path).read_text()


@durable_sandbox.workflow
async def waits_for_file(ctx: durable_sandbox.Context, data: dict[str, Any]) -> str:
    """Runs until the test creates ``data["path"]``: the test can look at the process executing it meanwhile."""
    return await ctx.step("wait", _wait_for_file, data["path"])


@durable_sandbox.workflow
async def counted(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    """``data``: log (file), steps (how many), share (the first step waits for a second worker)."""
    done = []
    for i in range(int(data["steps"])):
        fn = _record_and_share if data.get("share") and i == 0 else _record
        done.append(await ctx.step(f"s{i}", fn, data["log"], ctx.run_id, i))
    return {"steps": done}
