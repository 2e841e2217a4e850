"""The store as the Workflow controller's executors see it: every commit, run update and journal read is
reported, so status and Events are projections of what is written and read (``kube/workflow/publishing.py``);
nothing is read back for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable_sandbox.engine.records import Commit, OperationRecord, RunRecord
from durable_sandbox.engine.store import CommitsWithNewRun

__all__ = ["ObservedStore"]


class ObservedStore:
    """The store as the executor sees it, with every successful commit and run update reported, so
    status and Events are projections of what is written: nothing is read back for them."""

    def __init__(self, inner: Any, on_write: Callable[[str, Commit | None, dict[str, Any] | None], None],
                 event_interval: Callable[[], float] | None = None,
                 on_read: Callable[[str, list[OperationRecord]], None] | None = None,
                 owner_of: Callable[[RunRecord], Any] | None = None) -> None:
        self._inner = inner
        self._on_write = on_write
        self._event_interval = event_interval
        self._on_read = on_read
        self._owner_of = owner_of  # the Workflow a run the engine creates belongs to (a continue-as-new's next)

    @property
    def event_interval(self) -> float:
        """How long a run's events wait to be written in a batch (``RunRuntime`` reads it)."""
        if self._event_interval is not None:
            return self._event_interval()
        return float(getattr(self._inner, "event_interval", 0.0))

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        await self._inner.commit(run_id, fence, commit)
        self._on_write(run_id, commit, commit.run)

    async def commit_with_new_run(self, run_id: str, fence: int, commit: Commit, new_run: RunRecord) -> None:
        """A run's final commit that creates the run it continues as (engine/store.py ``CommitsWithNewRun``),
        reported as the commit it is (defined here: ``__getattr__`` would pass it by unreported)."""
        if isinstance(self._inner, CommitsWithNewRun):
            await self._inner.commit_with_new_run(run_id, fence, commit, new_run)
        else:  # as engine.store.commit_ending does, with the next run owned by the Workflow (self.create_run)
            await self.create_run(new_run)
            await self._inner.commit(run_id, fence, commit)
        self._on_write(run_id, commit, commit.run)

    async def create_run(self, run: RunRecord, **options: Any) -> Any:
        """A run the engine creates (a continue-as-new's next run) is owned by its chain's Workflow: its journal
        objects are collected with it."""
        if "owner" not in options and self._owner_of is not None and (owner := self._owner_of(run)) is not None:
            options["owner"] = owner
        return await self._inner.create_run(run, **options)

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        await self._inner.update_run(run_id, changes, fence=fence)
        self._on_write(run_id, None, changes)

    # Journal reads are reported too: rows another replica committed (the executor reads the journal when it
    # claims a run, and when it finds the run finished) reach the status projection before this process
    # writes status from it.

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return self._reported(run_id, await self._inner.load_journal(run_id))

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        return self._reported(run_id, await self._inner.journal_since(run_id, after_seq))

    def _reported(self, run_id: str, rows: list[OperationRecord]) -> list[OperationRecord]:
        if self._on_read is not None:
            self._on_read(run_id, rows)
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
