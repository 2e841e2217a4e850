"""The ``Engine``: the client side (:class:`RunClient`) and the worker side (:class:`RunExecutor`) of
one store, composed behind the API users know (``run``, ``start``, ``signal``, ``cancel``, ...).

Code that only talks to runs (the CLI's inspect/history/signal, the operator's spec-to-run mapping)
can use the client alone; code that executes runs uses the executor with a run source
(:mod:`engine.sources` for the store poller, the operator's Workflow controller, kube/workflow/, for Workflows).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Unpack

from durable_sandbox.engine.client import NewRun, RunClient, new_run_id
from durable_sandbox.engine.continue_as_new import next_of
from durable_sandbox.engine.driver import RunPolicy, enforce
from durable_sandbox.engine.errors import RunNotFinished
from durable_sandbox.engine.executor import (
    RunExecutor,
    RunHooks,
    Unresolvable,
    default_worker_id,
    resolve_run_workflow,
)
from durable_sandbox.engine.extensions import GENERIC_JOURNAL, Extensions, JournalReader
from durable_sandbox.engine.owner import new_worker_id
from durable_sandbox.engine.records import OperationRecord, RunRecord, RunStatus
from durable_sandbox.engine.sources import poll_store
from durable_sandbox.engine.state import RunState
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.traced import caller_labels
from durable_sandbox.engine.updates import UPDATE_WAIT_SECONDS, RunHandlerAccess, UpdateOutcome
from durable_sandbox.engine.workflow import definition_of

log = logging.getLogger("durable_sandbox.engine")

__all__ = ["Engine", "default_worker_id", "new_run_id", "resolve_run_workflow"]


class Engine:
    """Drives durable workflows over a :class:`Store`.

    ``sandbox_factory`` is the extension point behind ``ctx.sandbox``, ``hooks`` what the engine calls of
    it and ``reader`` how its records read (all wired by ``durable_sandbox.Engine``); ``extensions`` are typed values for extensions above the
    engine (engine/extensions.py). ``unresolvable`` says what the worker side does with a run whose workflow
    it cannot import (see :mod:`engine.executor`).
    """

    def __init__(
        self,
        store: Store,
        *,
        worker_id: str | None = None,
        lease_ttl: float = 30.0,
        inline_sleep_limit: float = 5.0,
        sandbox_factory: Callable[..., Any] | None = None,
        hooks: RunHooks | None = None,
        reader: JournalReader = GENERIC_JOURNAL,
        hibernate_after: float | None = None,
        extensions: Iterable[object] = (),
        unresolvable: Unresolvable = "leave",
    ) -> None:
        self.client = RunClient(store, reader=reader)
        self.executor = RunExecutor(
            store,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            inline_sleep_limit=inline_sleep_limit,
            sandbox_factory=sandbox_factory,
            hooks=hooks,
            reader=reader,
            hibernate_after=hibernate_after,
            extensions=extensions,
            unresolvable=unresolvable,
        )
        self._background: dict[str, asyncio.Task[Any]] = {}  # runs started here with `start`

    # Attributes of the worker side that callers (and extensions) read.
    @property
    def store(self) -> Store:
        return self.client.store

    @property
    def worker_id(self) -> str:
        return self.executor.worker_id

    @property
    def lease_ttl(self) -> float:
        return self.executor.lease_ttl

    @property
    def extensions(self) -> Extensions:
        return self.executor.extensions

    @property
    def driven(self) -> set[str]:
        return self.executor.driven

    # ------------------------------------------------------------------ creating and driving runs

    async def create(self, workflow: Any, input: Any = None, **new: Unpack[NewRun]) -> RunRecord:
        """Record a new run (status pending) without executing it; idempotent for the same id and input
        (``NewRun`` lists the options). With tracing on, the caller's trace context is recorded in its labels
        (engine/traced.py)."""
        new["labels"] = caller_labels(self.extensions, new.get("labels"), os.environ)
        return await self.client.create(workflow, input, **new)

    async def run(self, workflow: Any, input: Any = None, **new: Unpack[NewRun]) -> RunState:
        """Start (or continue) a run and drive it until it finishes or waits."""
        definition = definition_of(workflow)
        run = await self.create(definition, input, **new)
        return await self._drive(run.run_id, definition)

    async def start(self, workflow: Any, input: Any = None, **new: Unpack[NewRun]) -> str:
        """Create a run and drive it in the background of this process; returns its run id."""
        definition = definition_of(workflow)
        run = await self.create(definition, input, **new)
        task = asyncio.create_task(self._drive(run.run_id, definition), name=run.run_id)
        self._background[run.run_id] = task
        task.add_done_callback(lambda _: self._background.pop(run.run_id, None))
        return run.run_id

    async def resume(self, run_id: str) -> RunState:
        """Drive an existing run again: after a crash, a signal, a due timer, or to retry a failed run."""
        return await self._drive(run_id, None)

    async def wait(self, run_id: str, *, timeout: float | None = None) -> RunState:
        """Wait for a run to finish or wait: one started here with :meth:`start`, or one executed by any
        other process on the same store (polled; also returns when a dead worker left it orphaned).
        ``TimeoutError`` after ``timeout`` seconds."""
        task = self._background.get(run_id)
        if task is not None:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        else:
            await self.client.wait(run_id, timeout=timeout)
        return await self.inspect(run_id)

    async def _drive(self, run_id: str, definition: Any) -> RunState:
        """Drive the run, and the runs it continues as (``ctx.continue_as_new``): the state of the last."""
        state = await self.executor.drive(run_id, definition, if_busy="wait")
        assert state is not None  # "wait" never skips
        while (nxt := next_of(state.status, state.result)) is not None:
            state = await self.executor.drive(nxt, definition, if_busy="wait")
            assert state is not None
        return state

    async def open_runtime(self, run: RunRecord, lease: Any, **kwargs: Any) -> Any:
        return await self.executor.open_runtime(run, lease, **kwargs)

    # ------------------------------------------------------------------ control

    async def signal(self, run_id: str, callback_id: str, value: Any = None) -> bool:
        """Deliver ``value`` to callback ``callback_id``. Idempotent for the same value; a different
        value for an already-signalled callback raises ``SignalConflict``. Returns True if new.
        A signal for a callback the run has not reached yet is kept and delivered when it does."""
        return await self.client.signal(run_id, callback_id, value)

    async def cancel(self, run_id: str, reason: str = "cancelled by user") -> RunState:
        """Cancel a run: the running step is cancelled, sandbox cleanup runs, status becomes cancelled."""
        run = await self.client.request_cancel(run_id, reason)
        if run.status.terminal:
            return await self.inspect(run_id)
        if await self.executor.cancel_here(run_id, reason):
            return await self.inspect(run_id)
        # Not executing here. A waiting or pending run has nothing in flight: take its lease and
        # drive it once, so that its cleanup (sandbox finalization) runs before it is marked cancelled.
        try:
            await self.executor.drive_cancel(run_id)
        except Exception as exc:  # held by another worker: that worker notices through its lease loop
            log.info("run %s is executing elsewhere; cancellation requested (%s)", run_id, exc)
        return await self.inspect(run_id)

    async def delete(self, run_id: str, *, force: bool = False) -> None:
        """Delete a run with its journal, events and signals. A finished run's sandboxes are finalized first
        if its journal does not show them finalized. A pending, running or waiting run raises
        ``RunNotFinished`` unless ``force``: then it is cancelled first (its cleanup runs) and deleted once
        cancelled; one executing in another process is only asked to cancel (``RunNotFinished`` says so)."""
        run = await self.client.get(run_id)
        if not run.status.terminal:
            if not force:
                raise RunNotFinished(run_id, run.status.value)
            state = await self.cancel(run_id, "deleted (--force)")
            if state.status not in ("succeeded", "failed", "cancelled"):
                raise RunNotFinished(
                    run_id,
                    state.status,
                    f"Run {run_id!r} is executing in another process; it was asked to cancel. Delete it once "
                    f"it has stopped (`dsb wait {run_id}`).",
                )
        await self.executor.delete(run_id)

    async def prune(self, older_than: float, *, now: float | None = None) -> tuple[list[str], dict[str, str]]:
        """Delete finished runs last updated more than ``older_than`` seconds ago (see :meth:`delete`).
        Returns the deleted run ids and, for runs kept, why (a sandbox cleanup that failed, a resume)."""
        cutoff = (time.time() if now is None else now) - older_than
        finished = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED]
        deleted: list[str] = []
        kept: dict[str, str] = {}
        for run in await self.client.runs(status=finished, limit=1_000_000):
            if run.updated_at >= cutoff:
                continue
            try:
                await self.delete(run.run_id)
            except Exception as exc:  # one run's failed cleanup must not stop the others being pruned
                kept[run.run_id] = f"{type(exc).__name__}: {exc}"
                continue
            deleted.append(run.run_id)
        return deleted, kept

    async def hibernate(self, run_id: str) -> bool:
        """Hibernate the sandboxes of a waiting run now (snapshot and destroy them); True if it ran."""
        return await self.executor.hibernate(run_id)

    async def hibernate_idle(self, older_than: float) -> list[str]:
        """Hibernate the sandboxes of runs that have been waiting longer than ``older_than`` seconds."""
        return await self.executor.hibernate_idle(older_than)

    # ------------------------------------------------------------------ queries and updates (engine/updates.py)

    @property
    def handler_access(self) -> RunHandlerAccess:
        """Queries and updates of this engine's runs. An update's lease is held under an owner id of its own (this
        process, a fresh nonce): never the executor's, so no other claim of this process (a suspend, a cleanup) is
        mistaken for the update's and takes its fence; runs executing here are waited for through ``here``."""
        ex = self.executor
        return RunHandlerAccess(self.store, new_worker_id(), ex.lease_ttl, ex.here)

    async def query(self, run_id: str, name: str, arg: Any = None) -> Any:
        """The answer of the run's query handler ``name``: from its live state if it executes here, else from a
        read-only replay of its journal. No lease, nothing written, never blocks the run."""
        return await self.handler_access.query(run_id, name, arg)

    async def update(self, run_id: str, name: str, input: Any = None, *, update_id: str | None = None,
                     wait: float = UPDATE_WAIT_SECONDS) -> UpdateOutcome:
        """Apply the run's update handler ``name`` to ``input``: validated, journaled before its result is
        returned, applied exactly once per ``update_id`` (a retry returns the recorded result). A refused update
        (``UpdateRefused``) journals nothing."""
        return await self.handler_access.update(run_id, name, input, update_id=update_id, wait=wait)

    # ------------------------------------------------------------------ reading

    async def inspect(self, run_id: str) -> RunState:
        return await self.client.inspect(run_id)

    async def history(self, run_id: str) -> list[OperationRecord]:
        return await self.client.history(run_id)

    async def runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        return await self.client.runs(status=status, workflow=workflow, limit=limit)

    async def clear_cache(self, key: str | None = None, *, prefix: str | None = None) -> int:
        return await self.client.clear_cache(key, prefix=prefix)

    def stream(self, run_id: str, *, follow: bool = True, poll_interval: float = 0.05) -> AsyncIterator[dict[str, Any]]:
        """Events of a run: journal rows as operation events plus progress and run events.

        Works from any process on the same store. With ``follow``, ends when the run finishes or waits.
        """
        return self.client.stream(run_id, follow=follow, poll_interval=poll_interval)

    # ------------------------------------------------------------------ workers

    async def worker(
        self,
        *,
        concurrency: int = 4,
        poll_interval: float = 0.5,
        workflows: Sequence[str] | None = None,
        stop: asyncio.Event | None = None,
        idle_exit: bool = False,
    ) -> list[str]:
        """Claim runnable runs (pending, due, or orphaned by a dead worker) and execute them; returns the
        ids of the runs executed. Runs' recorded policies are honoured (engine/driver.py): a run past its
        deadline is cancelled, a failed run is retried when its next attempt is due."""
        return await poll_store(
            self.executor,
            concurrency=concurrency,
            poll_interval=poll_interval,
            workflows=workflows,
            stop=stop,
            idle_exit=idle_exit,
            sweep=lambda: enforce(self, RunPolicy.of),  # deadlines and retries recorded with the runs
        )

    async def aclose(self) -> None:
        """Stop runs started here in the background, and child workflows executing here; they stay runnable for
        another worker."""
        tasks = list(self._background.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.executor.children.aclose()
