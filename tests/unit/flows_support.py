"""Drive example flows in a child process (so a test can SIGKILL it through DURABLE_SANDBOX_FAULT).

    python -m tests.unit.flows_support start DB WORKFLOW RUN_ID INPUT_JSON [CALLBACK=VALUE_JSON ...]
    python -m tests.unit.flows_support worker DB
"""

from __future__ import annotations

import asyncio
import json
import sys

import durable_sandbox
from durable_sandbox.stores import SqliteStore


async def start(db: str, workflow: str, run_id: str, data: str, signals: list[str]) -> None:
    engine = durable_sandbox.Engine(SqliteStore(db), worker_id="worker-1", lease_ttl=0.5)
    await engine.create(workflow, json.loads(data), run_id=run_id)
    for item in signals:  # signals for callbacks not reached yet are kept until the run gets there
        cb, _, value = item.partition("=")
        await engine.signal(run_id, cb, json.loads(value))
    await engine.resume(run_id)


async def worker(db: str) -> None:
    engine = durable_sandbox.Engine(SqliteStore(db), worker_id="worker-2", lease_ttl=5)
    await engine.worker(idle_exit=True, poll_interval=0.05)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "start":
        asyncio.run(start(rest[0], rest[1], rest[2], rest[3], rest[4:]))
    else:
        asyncio.run(worker(rest[0]))
