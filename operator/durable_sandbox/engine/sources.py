"""Run sources: where a worker finds the runs it executes.

``poll_store`` is the source behind ``dsb worker``: it asks the store for runnable runs (pending, due
timers, orphaned by a dead worker) with ``claim_next``. The operator is another source: its kopf
daemons hand the run of each Workflow to :meth:`RunExecutor.drive` (see ``kube/controller.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.errors import StoreUnavailable
from durable_sandbox.engine.executor import RunExecutor

log = logging.getLogger("durable_sandbox.engine")


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
        away = False
        if len(running) < concurrency:
            try:
                lease = await store.claim_next(executor.worker_id, executor.lease_ttl, workflows=workflows)
            except StoreUnavailable as exc:
                # The store is away for longer than it waits (a server restart, a failover): the worker is
                # not broken, it looks again later, as it does when nothing is runnable.
                log.warning("worker %s: %s", executor.worker_id, exc)
                away = True
        if lease is not None:
            executed.append(lease.run_id)
            task = asyncio.create_task(executor.run_claimed(lease))
            running.add(task)
            task.add_done_callback(running.discard)
            continue
        if idle_exit and not running and not away:  # "idle" is what the store said, not that it was away
            return executed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_interval)
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    return executed
