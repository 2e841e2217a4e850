"""Holding a run at its boundary while the store refuses to record what the run did.

A store that refuses a write for good (``StoreRefused``: a ResourceQuota on the journal's objects, an
admission policy, a read-only database) used to stop the run where it was: whatever completed since the last
commit (a tool call's result riding on the next write) was lost with the execution, and the next execution ran
that call again, every time the operator looked, for as long as the refusal lasted. With a
:class:`RefusalHold` among the engine's extensions, the run instead stays at that boundary with its records in
memory and offers the same commit again with a backoff, until the store takes it: a completed call is never
executed again while the refusal lasts. Whoever drives the run is told (:class:`RefusalWatcher`) so it can say
so where people look. If the process dies meanwhile, the journal is as it was before the refused commit, and
the started record and the sandbox's replay rules apply as after any crash.

Without a hold (``dsb run``, ``dsb worker``) a refusal stops the run at once, as it always did: a person at a
terminal is told and resumes the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import StoreRefused
from durable_sandbox.engine.store import commit_ending

if TYPE_CHECKING:
    from durable_sandbox.engine.records import Commit, RunRecord
    from durable_sandbox.engine.store import Store

__all__ = ["RefusalHold", "RefusalWatcher", "commit_holding"]


class RefusalWatcher(Protocol):
    """Told while a run is held at a refused commit, and once the commit is taken."""

    def held(self, run_id: str, refusal: StoreRefused, attempt: int, retry_in: float) -> None:
        """The store refused commit attempt ``attempt`` (1 for the first); the next is in ``retry_in`` seconds."""

    def lifted(self, run_id: str, attempts: int) -> None:
        """The commit was taken after ``attempts`` refusals: the run goes on."""


@dataclass(frozen=True)
class RefusalHold:
    """The engine extension that turns a refused commit into a hold (see the module)."""

    watcher: RefusalWatcher
    first_delay: float = 1.0  # seconds before the second attempt; doubled each time up to max_delay
    max_delay: float = 30.0

    def delay(self, attempt: int) -> float:
        return float(min(self.first_delay * 2 ** max(attempt - 1, 0), self.max_delay))


async def commit_holding(store: Store, run_id: str, fence: int, commit: Commit, hold: RefusalHold | None,
                         *, released: Callable[[], bool] = lambda: False, new_run: RunRecord | None = None) -> None:
    """``store.commit`` that, with a ``hold``, waits out a refusal instead of raising it. A commit that was
    refused wrote nothing (every store's commit is atomic, or idempotent when offered again), so the same
    commit is offered again. ``released()`` true (the run is handed over: a replica stopping, a suspend) ends
    the hold with the refusal; a cancellation of the task ends it at once (the refused records are then what
    a crash would have lost). ``new_run``: created with the commit (``engine.store.commit_ending``)."""
    attempt = 0
    while True:
        try:
            await commit_ending(store, run_id, fence, commit, new_run)
        except StoreRefused as refusal:
            if hold is None or released():
                raise
            attempt += 1
            retry_in = hold.delay(attempt)
            hold.watcher.held(run_id, refusal, attempt, retry_in)
            faults.reach("refused-commit")
            await asyncio.sleep(retry_in)
            continue
        if attempt and hold is not None:
            hold.watcher.lifted(run_id, attempt)
        return
