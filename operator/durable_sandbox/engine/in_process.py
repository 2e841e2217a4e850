"""The runs this process executes: at most one execution of a run at a time, its workflow task and its
runtime while it runs, a user cancel delivered to it once, and a hand-over.

Whatever the run source, a run already executing in this process is never claimed a second time by it: a
second claim by the same owner would advance the fence and cut off the execution that is running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from durable_sandbox.engine.runtime import RunRuntime


class ExecutingHere:
    """Which runs execute (or are being taken to execute) here, with their task and runtime."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[Any]] = {}  # run id -> workflow task executing here
        self.runtimes: dict[str, RunRuntime] = {}  # run id -> its runtime while executing here
        self._cancelling: set[str] = set()  # runs whose workflow task was cancelled (cleanup in progress)
        self._active: dict[str, asyncio.Event] = {}  # run id -> set when this process stops executing it

    def is_executing(self, run_id: str) -> bool:
        """True while this process holds (or is taking) the run's lease to execute it."""
        return run_id in self._active

    async def idle(self, run_id: str) -> None:
        """Until no execution of ``run_id`` is under way in this process."""
        while (busy := self._active.get(run_id)) is not None:
            await busy.wait()

    @contextlib.asynccontextmanager
    async def exclusive(self, run_id: str, *, wait: bool) -> AsyncIterator[bool]:
        """Mark ``run_id`` as executing here; yields False (and marks nothing) if it already is and
        ``wait`` is false, else waits for the other execution to end first."""
        while (busy := self._active.get(run_id)) is not None:
            if not wait:
                yield False
                return
            await busy.wait()
        done = asyncio.Event()
        self._active[run_id] = done
        try:
            yield True
        finally:
            self._active.pop(run_id, None)
            done.set()

    @contextlib.contextmanager
    def running(self, rt: RunRuntime, task: asyncio.Task[Any]) -> Iterator[None]:
        """The workflow task of ``rt``'s run, known here while it runs (to cancel it, to hand it over)."""
        self.tasks[rt.run_id] = task
        self.runtimes[rt.run_id] = rt
        try:
            yield
        finally:
            self.tasks.pop(rt.run_id, None)
            self.runtimes.pop(rt.run_id, None)

    def hand_over(self, run_id: str, why: str) -> bool:
        """Stop executing ``run_id`` here at its next operation boundary; False if it does not execute here."""
        rt = self.runtimes.get(run_id)
        if rt is None:
            return False
        rt.handover = why
        return True

    def cancel_once(self, run_id: str, task: asyncio.Task[Any]) -> None:
        """Cancel the run's workflow task for a user cancel, once, whoever notices the cancel first (this
        process's ``cancel_here``, or the lease keeper polling the store): a second cancel would interrupt the
        cleanup the first one started (sandbox finalization runs inside the cancelled task), and the run
        would end ``cancelled`` with its sandbox and snapshots left behind."""
        if run_id in self._cancelling:
            return
        self._cancelling.add(run_id)
        task.add_done_callback(lambda _: self._cancelling.discard(run_id))
        task.cancel()
