"""``python -m tests.unit.fork_child <db> fork <run> <after> <fork id>...`` or ``... delete <run>``: one fork or one
delete in a child process, which a ``DURABLE_SANDBOX_FAULT`` kills at a fault point (tests/unit/test_forks.py).
The local provider's home is ``$DURABLE_SANDBOX_HOME``, inherited from the test."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import durable_sandbox
import tests.unit.fork_support  # noqa: F401 - registers the source's workflow
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore

WORKER = "fork-child"


async def main(db: str, op: str, run_id: str, *rest: str) -> None:
    engine = durable_sandbox.Engine(SqliteStore(Path(db)), providers={"local": LocalProvider()}, worker_id=WORKER)
    try:
        if op == "fork":
            await engine.fork(run_id, after_call=int(rest[0]), count=len(rest) - 1, run_ids=list(rest[1:]))
        else:
            await engine.delete(run_id, force=True)
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
