"""The client side of the engine: create runs and talk to them through the store, from any process.

Nothing here executes workflow code: creating, signalling, requesting cancellation, inspecting, reading
history and streaming only read and write the store, so the same client serves `dsb`, the operator's
spec-to-store mapping and code that drives runs elsewhere. Execution is :mod:`engine.executor`; queries and
updates, which replay workflow code, are :mod:`engine.updates` (``Engine.query``/``update``, or
``RunHandlerAccess(store, owner)`` without an engine).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypedDict, Unpack

from durable_sandbox.engine.errors import InvalidInput, RunConflict, RunNotFound
from durable_sandbox.engine.events import tail
from durable_sandbox.engine.extensions import GENERIC_JOURNAL, JournalReader
from durable_sandbox.engine.records import Event, OperationRecord, RunRecord, RunStatus
from durable_sandbox.engine.serialization import to_jsonable
from durable_sandbox.engine.state import RunState, build_state
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.workflow import definition_of

# A run in one of these has settled for a follower: it finished or waits for something outside it.
SETTLED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.WAITING)


def new_run_id() -> str:
    return "run-" + uuid.uuid4().hex[:12]


class NewRun(TypedDict, total=False):
    """The options of a new run, one list for every way to create one (``RunClient.record``/``create``,
    ``Engine.create``/``run``/``start``): ``run_id`` (default: a new one; the same id and input again is
    the same run), ``thread_id`` (runs of one conversation) and ``labels``."""

    run_id: str | None
    thread_id: str | None
    labels: dict[str, str] | None


class RunClient:
    """Create, signal, cancel (request), inspect, history, stream and list runs of one store. ``reader`` says
    what the records of the engine's extensions mean (engine/extensions.py; the sandbox sessions')."""

    def __init__(self, store: Store, *, reader: JournalReader = GENERIC_JOURNAL) -> None:
        self.store = store
        self.reader = reader

    def record(self, workflow: Any, input: Any = None, **new: Unpack[NewRun]) -> RunRecord:
        """The record of a new run, checked (input against the workflow's type) but not stored: for
        stores that take more than the record when a run is created (the cluster's owner reference)."""
        unknown = new.keys() - NewRun.__annotations__.keys()
        if unknown:  # a keyword signature would refuse it too: a misspelt option is no silent default
            raise TypeError(f"unexpected option(s) for a new run: {', '.join(sorted(unknown))} "
                            f"(the options are {', '.join(NewRun.__annotations__)})")
        definition = definition_of(workflow)
        data = to_jsonable(input, what="The workflow input")
        try:
            definition.check_input(data)  # reject bad input before a run exists, not when it executes
        except InvalidInput as exc:
            raise InvalidInput(f"Input for workflow {definition.name!r} is invalid: {exc}") from None
        return RunRecord(
            run_id=new.get("run_id") or new_run_id(),
            workflow=definition.name,
            input=data,
            thread_id=new.get("thread_id"),
            labels=new.get("labels") or {},
            workflow_ref=definition.ref,
        )

    async def create(self, workflow: Any, input: Any = None, **new: Unpack[NewRun]) -> RunRecord:
        """Record a new run (status pending) without executing it; idempotent for the same id and input."""
        run = self.record(workflow, input, **new)
        stored, created = await self.store.create_run(run)
        if not created and (stored.workflow != run.workflow or stored.input != run.input):
            raise RunConflict(
                f"Run id {run.run_id!r} already exists for workflow {stored.workflow!r} with another input; "
                f"use a new run id, or `resume` the existing run."
            )
        return stored

    async def signal(self, run_id: str, callback_id: str, value: Any = None) -> bool:
        """Deliver ``value`` to callback ``callback_id``. Idempotent for the same value; a different
        value for an already-signalled callback raises ``SignalConflict``. Returns True if new.
        A signal for a callback the run has not reached yet is kept and delivered when it does."""
        await self.get(run_id)
        data = to_jsonable(value, what="The signal value")
        new = await self.store.put_signal(run_id, callback_id, data)
        # Read the run only after the signal is stored: either this sees the run waiting on it, or the
        # executing worker (which re-reads signals after recording "waiting") sees the signal.
        run = await self.get(run_id)
        if run.status == RunStatus.WAITING and callback_id in run.pending_callbacks:
            await self.store.update_run(run_id, {"status": RunStatus.PENDING})
        await self.store.append_events([Event(run_id, "signal.received", {"callbackId": callback_id})])
        return new

    async def request_cancel(self, run_id: str, reason: str) -> RunRecord:
        """Record that the run must be cancelled; whoever executes it (or cleans it up) acts on it.
        Returns the run as it was before the request; a finished run is left unchanged."""
        run = await self.get(run_id)
        if not run.status.terminal and run.cancel_requested is None:
            await self.store.update_run(run_id, {"cancel_requested": reason})
        return run

    async def wait(self, run_id: str, *, timeout: float | None = None, poll_interval: float = 0.2) -> RunRecord:
        """Poll the store until the run finishes or waits (``SETTLED``), or nobody executes it any more
        (stale: its worker died); ``TimeoutError`` after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            run = await self.get(run_id)
            if run.status in SETTLED or run.stale:
                return run
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"run {run_id!r} is still {run.status.value} after {timeout:g}s")
            await asyncio.sleep(poll_interval if deadline is None else min(poll_interval, max(deadline - loop.time(), 0)))

    # ------------------------------------------------------------------ reading

    async def get(self, run_id: str) -> RunRecord:
        return await require_run(self.store, run_id)

    async def inspect(self, run_id: str) -> RunState:
        run = await self.get(run_id)
        return state_of(run, await self.store.load_journal(run_id), self.reader)

    async def history(self, run_id: str) -> list[OperationRecord]:
        await self.get(run_id)
        return await self.store.load_journal(run_id)

    async def runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        return await self.store.list_runs(status=status, workflow=workflow, limit=limit)

    async def clear_cache(self, key: str | None = None, *, prefix: str | None = None) -> int:
        return await self.store.cache_clear(key, prefix=prefix)

    async def stream(self, run_id: str, *, follow: bool = True, poll_interval: float = 0.05) -> AsyncIterator[dict[str, Any]]:
        """Events of a run: journal rows as operation events plus progress and run events.

        Works from any process on the same store. With ``follow``, ends when the run finishes or waits.
        """
        await self.get(run_id)

        async def done() -> bool:
            return not follow or (await self.get(run_id)).status in SETTLED

        async def pause() -> None:
            await asyncio.sleep(poll_interval)

        async for event in tail(self.store, run_id, done=done, pause=pause, reader=self.reader):
            yield event


async def require_run(store: Store, run_id: str) -> RunRecord:
    run = await store.get_run(run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def state_of(run: RunRecord, rows: list[OperationRecord], reader: JournalReader = GENERIC_JOURNAL) -> RunState:
    """The run's state; callbacks are pending only while the run can still take signals."""
    return build_state(run, rows, reader,
                       callbacks=run.status in (RunStatus.WAITING, RunStatus.PENDING, RunStatus.RUNNING))
