"""A cap on the runs one operator replica executes at once (``dsb operator --max-concurrent-runs``).

Every replica serves every Workflow, but only the runs a replica executes (holds the Lease of) cost it
CPU, memory, provider calls and API writes. A run that would exceed the cap waits for a slot *before*
claiming its Lease, so another replica with a free slot can take it, and its Workflow shows ``Ready=False``
with reason ``ConcurrencyLimit`` (phase ``Pending``) until a slot frees. Slots are handed
out first come, first served (asyncio's semaphore queues waiters in order), so no run starves.

A run queued for a slot holds its task (kube/workflow/scheduler.py: an active run); a run that starts waiting on a
signal or a timer gives its slot back and is parked (no task at all until woken).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = [
    "CONCURRENCY_LIMIT_REASON",
    "DEFAULT_MAX_CONCURRENT_RUNS",
    "RunSlots",
    "concurrency_limit_condition",
]

CONCURRENCY_LIMIT_REASON = "ConcurrencyLimit"
# Each executing run holds a journal page, a provider client and a status writer: a few MiB at most, so
# 50 keeps one replica well inside its chart's memory limit while the rest wait (or go to other replicas).
DEFAULT_MAX_CONCURRENT_RUNS = 50


class RunSlots:
    """At most ``limit`` runs hold a slot at once; ``slot(run_id)`` waits for one, in arrival order."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"--max-concurrent-runs must be a positive integer, got {limit!r}")
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit)
        self._holders: set[str] = set()
        self._waiting: list[str] = []

    @property
    def executing(self) -> frozenset[str]:
        return frozenset(self._holders)

    @property
    def waiting(self) -> tuple[str, ...]:
        return tuple(self._waiting)

    @contextlib.asynccontextmanager
    async def slot(
        self, run_id: str, *, on_wait: Callable[[], Awaitable[Any] | None] | None = None
    ) -> AsyncIterator[None]:
        """Hold a slot for ``run_id`` while the block runs. When none is free, ``on_wait`` is called once
        (to show the run as Pending with :func:`concurrency_limit_condition`) before waiting."""
        if run_id in self._holders:
            raise RuntimeError(f"run {run_id} already holds an execution slot on this replica")
        if self._semaphore.locked() or self._waiting:
            self._waiting.append(run_id)
            try:
                if on_wait is not None:
                    pending = on_wait()
                    if pending is not None:
                        await pending
                await self._semaphore.acquire()
            finally:
                self._waiting.remove(run_id)
        else:
            await self._semaphore.acquire()
        self._holders.add(run_id)
        try:
            yield
        finally:
            self._holders.discard(run_id)
            self._semaphore.release()


def concurrency_limit_condition(limit: int, waiting: int) -> dict[str, str]:
    """The ``Ready`` condition of a run waiting for a slot (``lastTransitionTime`` is the writer's job)."""
    return {
        "type": "Ready",
        "status": "False",
        "reason": CONCURRENCY_LIMIT_REASON,
        "message": (
            f"this operator replica already executes {limit} runs (--max-concurrent-runs {limit}); "
            f"the run starts when one of them finishes or waits ({waiting} run(s) queued here)"
        ),
    }
