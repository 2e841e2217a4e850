"""A run replayed read-only, to the point its journal reaches: what a query reads and an update is applied to.

The workflow function runs again from the top against the run's journal with a runtime in read-only mode:
every completed operation returns its recorded result; the first operation the journal does not record as
completed, any write, a sandbox and any store write stop the replay there (``ReplayFrontier``). Nothing is
executed (no step function, no provider call, no child started), nothing is written, no lease is taken: the
run, wherever it executes, is never blocked. The recorded updates are applied (engine/run_handlers.py), so the
handlers the workflow registered see the state the run has now.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.context import Context
from durable_sandbox.engine.extensions import Extensions
from durable_sandbox.engine.records import Commit, Event, Lease, OperationRecord, RunRecord, RunStatus
from durable_sandbox.engine.runtime import ReplayFrontier, RunRuntime
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.workflow import WorkflowDefinition

# A replay that has not reached its frontier by then (workflow code awaiting something outside the engine)
# is stopped where it is.
REPLAY_LIMIT_SECONDS = 30.0


class ReadOnlyStore:
    """The store, read-only: reads go through, every write stops the replay (``ReplayFrontier``); events (an
    observer's feed) are dropped, so a replay writes nothing at all."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def _refuse(what: str) -> ReplayFrontier:
        return ReplayFrontier(f"(store: {what})")

    async def create_run(self, run: RunRecord) -> tuple[RunRecord, bool]:
        raise self._refuse("create_run")

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._store.get_run(run_id)

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        return await self._store.list_runs(status=status, workflow=workflow, limit=limit)

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        raise self._refuse("update_run")

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        raise self._refuse("delete_run")

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self._store.load_journal(run_id)

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        raise self._refuse("commit")

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        raise self._refuse("claim")

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        raise self._refuse("renew")

    async def release(self, lease: Lease) -> None:
        raise self._refuse("release")

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None,
                         build: BuildClaims | None = None) -> Lease | None:
        raise self._refuse("claim_next")

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        raise self._refuse("put_signal")

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        return await self._store.get_signals(run_id)

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        return await self._store.cache_get(key, now)

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        raise self._refuse("cache_clear")

    async def get_thread_state(self, thread_id: str) -> Any:
        return await self._store.get_thread_state(thread_id)

    async def append_events(self, events: Sequence[Event]) -> None:
        return None  # dropped: a replay is no execution, it has nothing to report

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        return await self._store.read_events(run_id, after, limit)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        return await self._store.journal_since(run_id, after_seq)

    async def close(self) -> None:
        return None  # not ours to close


class _NoSandbox:
    """``ctx.sandbox`` in a read-only replay: entering it is the frontier (a sandbox is never re-attached)."""

    def __init__(self, id: str) -> None:
        self.id = id

    async def __aenter__(self) -> Any:
        raise ReplayFrontier(f"(sandbox {self.id})")

    async def __aexit__(self, *exc: object) -> None:
        return None


def _no_sandbox(ctx: Any, id: str, **options: Any) -> _NoSandbox:
    return _NoSandbox(id)


async def replay_read_only(store: Store, run: RunRecord, rows: list[OperationRecord],
                           definition: WorkflowDefinition) -> RunRuntime:
    """Replay ``run`` (journal ``rows``) read-only to its frontier; the runtime holds the handlers it
    registered, with every recorded update applied."""
    ro = ReadOnlyStore(store)
    rt = RunRuntime(
        store=ro,
        run_id=run.run_id,
        workflow=run.workflow,
        fence=-1,  # never a fence: nothing is written
        epoch=run.epoch,
        rows=list(rows),
        signals={},
        thread_id=run.thread_id,
        thread_state=(await store.get_thread_state(run.thread_id)) if run.thread_id else None,
        sandbox_factory=_no_sandbox,
        inline_sleep_limit=0.0,
        extensions=Extensions(),
        read_only=True,
    )

    async def call() -> Any:
        return await definition.fn(Context(rt), *definition.prepare_input(run.input))

    task = asyncio.create_task(call(), name=f"read-only replay of {run.run_id}")
    try:
        await asyncio.wait({task}, timeout=REPLAY_LIMIT_SECONDS)
    finally:
        task.cancel()  # nothing if it ended; else it stops where it waits
    with contextlib.suppress(BaseException):  # how the replay stopped does not matter: where it got to does
        await task
    rt.handlers.catch_up(None)
    return rt
