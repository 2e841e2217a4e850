"""Run sources: where a worker finds the runs it executes.

``poll_store`` is the source behind ``dsb worker``: it asks the store for runnable runs (pending, due
timers, orphaned by a dead worker) with ``claim_next``. The operator is another source: its Workflow
controller hands the run of each Workflow to :meth:`RunExecutor.drive` (``kube/workflow/execution.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.executor import RunExecutor


async def poll_store(
    executor: RunExecutor,
    *,
    concurrency: int = 4,
    poll_interval: float = 0.5,
    workflows: Sequence[str] | None = None,
    stop: asyncio.Event | None = None,
    idle_exit: bool = False,
) -> list[str]:
    """Claim runnable runs (pending, due, or orphaned by a dead worker) and execute them; returns the ids
    of the runs it executed, in the order it claimed them (a run claimed twice, e.g. woken again, twice)."""
    stop = stop or asyncio.Event()
    executed: list[str] = []
    store = executor.store
    running: set[asyncio.Task[Any]] = set()
    hibernate_after = executor.services.get("hibernate_after")
    next_sweep = 0.0
    while not stop.is_set():
        if hibernate_after is not None and "hibernate_run" in executor.services and time.time() >= next_sweep:
            next_sweep = time.time() + max(1.0, min(float(hibernate_after) / 2, 30.0))
            await executor.hibernate_idle(float(hibernate_after))
        lease = None
        if len(running) < concurrency:
            lease = await store.claim_next(executor.worker_id, executor.lease_ttl, workflows=workflows)
        if lease is not None:
            executed.append(lease.run_id)
            task = asyncio.create_task(executor.run_claimed(lease))
            running.add(task)
            task.add_done_callback(running.discard)
            continue
        if idle_exit and not running:
            return executed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_interval)
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    return executed
