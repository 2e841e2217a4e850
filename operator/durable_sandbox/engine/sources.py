"""Run sources: where a worker finds the runs it executes.

``poll_store`` is the source behind ``dsb worker``: it asks the store for runnable runs (pending, due
timers, orphaned by a dead worker) with ``claim_next``. The operator is another source: its Workflow
controller hands the run of each Workflow to :meth:`RunExecutor.drive` (``kube/workflow/execution.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from durable_sandbox.engine.builds import BuildClaims, PinnedToBuild, WorkerBuild, claims_of
from durable_sandbox.engine.errors import LeaseHeld, StoreUnavailable
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.observed_store import observer_of
from durable_sandbox.engine.records import Lease, RunRecord

# Runs' policies (deadlines, retries: engine/driver.py) are looked at this often at most.
POLICY_SWEEP_SECONDS = 1.0

log = logging.getLogger("durable_sandbox.engine")


async def poll_store(
    executor: RunExecutor,
    *,
    concurrency: int = 4,
    poll_interval: float = 0.5,
    workflows: Sequence[str] | None = None,
    stop: asyncio.Event | None = None,
    idle_exit: bool = False,
    sweep: Callable[[], Awaitable[list[RunRecord]]] | None = None,
) -> list[str]:
    """Claim runnable runs (pending, due, or orphaned by a dead worker) and execute them; returns the ids
    of the runs it executed, in the order it claimed them (a run claimed twice, e.g. woken again, twice).

    ``sweep`` enforces the runs' policies (:func:`engine.driver.enforce`: deadlines) and returns the failed
    runs whose next attempt is due, which are claimed and executed like the others."""
    stop = stop or asyncio.Event()
    executed: list[str] = []
    skipped = _Skipped(executor)
    store = executor.store
    running: set[asyncio.Task[Any]] = set()
    retries: list[RunRecord] = []
    next_policy_sweep = 0.0
    hibernate_after = executor.hibernate_after
    next_sweep = 0.0
    try:
        while not stop.is_set():
            if hibernate_after is not None and executor.hooks is not None and time.time() >= next_sweep:
                next_sweep = time.time() + max(1.0, min(float(hibernate_after) / 2, 30.0))
                await executor.hibernate_idle(float(hibernate_after))
            away = False
            if sweep is not None and not retries and time.time() >= next_policy_sweep:
                next_policy_sweep = time.time() + max(POLICY_SWEEP_SECONDS, poll_interval)
                try:
                    retries = [r for r in await sweep() if not workflows or r.workflow in workflows]
                except StoreUnavailable as exc:  # as for claim_next below: looked at again at the next sweep
                    log.warning("worker %s: %s", executor.worker_id, exc)
                    away = True
            lease = None
            if len(running) < concurrency:
                try:
                    # Only runs this worker's build may take (engine/builds.py), by what it has imported now.
                    build = claims_of(executor.extensions.get(WorkerBuild))
                    pinned = {} if build is None else {"build": build}  # a Store of before builds takes no build
                    lease = await _claim_retry(executor, retries, skipped, build) or await store.claim_next(
                        executor.worker_id, executor.lease_ttl, workflows=workflows, **pinned)
                except StoreUnavailable as exc:
                    # The store is away for longer than it waits (a server restart, a failover): the worker is
                    # not broken, it looks again later, as it does when nothing is runnable.
                    log.warning("worker %s: %s", executor.worker_id, exc)
                    away = True
            if lease is not None:
                executed.append(lease.run_id)
                task = asyncio.create_task(skipped.run(lease))
                running.add(task)
                task.add_done_callback(running.discard)
                continue
            if idle_exit and not running and not away:  # "idle" is what the store said, not that it was away
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_interval)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await skipped.release_all()  # the runs it could not import go to the next worker at once
    return [run_id for run_id in executed if run_id not in skipped.warned]


class _Skipped:
    """The runs whose workflow this worker cannot import: each said once (a WARNING), its claim kept until
    its lease runs out so the store does not hand it out again at once (a hot loop that would starve the
    other runs), then tried again; every claim still kept is given back when the worker stops."""

    def __init__(self, executor: RunExecutor) -> None:
        self.executor = executor
        self.parked: dict[str, Lease] = {}
        self.warned: set[str] = set()

    async def run(self, lease: Lease) -> None:
        not_runnable = await self.executor.run_claimed(lease)
        if not_runnable is None:
            self.parked.pop(lease.run_id, None)
            self.warned.discard(lease.run_id)
            return
        if lease.run_id not in self.warned:
            self.warned.add(lease.run_id)
            log.warning("worker %s skips run %s: %s", self.executor.worker_id, lease.run_id, not_runnable)
            observer = observer_of(self.executor.store)
            if observer is not None and isinstance(not_runnable, PinnedToBuild):
                observer.skipped_pinned()
        if isinstance(not_runnable, PinnedToBuild) and await self._skipped_from_now_on(lease.run_id):
            # Its workflow, imported now, is known here to be pinned: claim_next skips the run from now on, so
            # the claim goes back at once, to a worker of the run's build (no hot loop, no lease-long delay).
            with contextlib.suppress(Exception):
                await self.executor.store.release(lease)
            return
        self.parked[lease.run_id] = lease

    async def _skipped_from_now_on(self, run_id: str) -> bool:
        """Whether ``claim_next`` no longer hands this worker the run (else its claim is kept: no hot loop)."""
        build = claims_of(self.executor.extensions.get(WorkerBuild))
        with contextlib.suppress(Exception):
            run = await self.executor.store.get_run(run_id)
            return build is not None and run is not None and not build.admits(run)
        return False

    def holds(self, run_id: str) -> bool:
        lease = self.parked.get(run_id)
        return lease is not None and lease.expires_at > time.time()

    async def release_all(self) -> None:
        for lease in self.parked.values():
            with contextlib.suppress(Exception):
                await self.executor.store.release(lease)
        self.parked.clear()


async def _claim_retry(executor: RunExecutor, retries: list[RunRecord], skipped: _Skipped,
                       build: BuildClaims | None) -> Lease | None:
    """The lease of the next failed run whose retry is due (one another worker holds is skipped, one pinned to
    another build, and one whose workflow this worker could not import, until that claim runs out)."""
    while retries:
        run = retries.pop(0)
        if executor.is_executing(run.run_id) or skipped.holds(run.run_id):
            continue
        if build is not None and not build.admits(run):
            continue
        with contextlib.suppress(LeaseHeld):
            return await executor.claim(run.run_id)
    return None
