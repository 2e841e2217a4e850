"""Waiting for a dead worker's lease to run out: a condition with a deadline, not a fixed sleep."""

from __future__ import annotations

import asyncio
import time

from durable_sandbox.stores import SqliteStore


async def wait_for_lease_expiry(db: str, run_id: str, deadline: float = 30.0) -> None:
    store = SqliteStore(db)
    try:
        give_up = time.monotonic() + deadline
        while True:
            run = await store.get_run(run_id)
            assert run is not None, f"run {run_id} does not exist"
            if run.lease_expires_at is None or run.lease_expires_at <= time.time():
                return
            if time.monotonic() > give_up:
                raise TimeoutError(f"the lease on {run_id} (held by {run.lease_owner}) did not expire in {deadline}s")
            await asyncio.sleep(min(0.05, max(0.0, run.lease_expires_at - time.time())))
    finally:
        await store.close()
