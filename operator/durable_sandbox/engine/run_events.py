"""A run's events (``run.started``, ``progress``, ...), batched to the store off the step path.

Events are for observers, not for correctness: a failed batch never fails the run. A store whose writes are
dear (``event_interval``: KubernetesStore, where each is an API write) gets at most one batch per interval;
``flush`` cuts the wait short when the run stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.records import Event

if TYPE_CHECKING:
    from durable_sandbox.engine.store import Store


class RunEvents:
    """The events one execution of ``run_id`` emits, waiting for their batch."""

    def __init__(self, store: Store, run_id: str) -> None:
        self._store = store
        self._run_id = run_id
        self._events: list[Event] = []
        self._flush: asyncio.Task[None] | None = None
        self._written = float("-inf")  # monotonic time of the last batch written
        self._now = asyncio.Event()  # set when the run stops: write what is left without waiting

    def emit(self, type: str, **data: Any) -> None:
        self._events.append(Event(self._run_id, type, {k: v for k, v in data.items() if v is not None}))
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._write_batches())

    async def _write_batches(self) -> None:
        while self._events:
            wait = self._written + float(getattr(self._store, "event_interval", 0.0)) - time.monotonic()
            if wait > 0 and not self._now.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._now.wait(), wait)
            else:
                await asyncio.sleep(0)
            batch, self._events = self._events, []
            self._written = time.monotonic()
            try:
                await self._store.append_events(batch)
            except Exception:  # an observer's feed must never fail the run
                return

    async def flush(self) -> None:
        """The run stops: write what is left now."""
        self._now.set()
        if self._flush is not None:
            await asyncio.shield(self._flush)
        if self._events:
            batch, self._events = self._events, []
            await self._store.append_events(batch)
