"""The ``Engine``: creates runs, drives them under a lease, and answers inspect/history/signal/cancel.

A run is driven by re-executing the workflow function from the top; the journal makes every
completed operation return its recorded result, so "resume" and "replay" are the same thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from durable_sandbox.engine.context import Context
from durable_sandbox.engine.errors import (
    InvalidInput,
    LeaseHeld,
    LeaseLost,
    RunConflict,
    RunNotFound,
    Suspend,
    WorkflowNotFound,
)
from durable_sandbox.engine.events import tail
from durable_sandbox.engine.records import (
    Commit,
    ErrorInfo,
    Event,
    Lease,
    OperationRecord,
    RunRecord,
    RunStatus,
)
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.serialization import to_jsonable
from durable_sandbox.engine.state import RunState, build_state
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.workflow import WorkflowDefinition, definition_of, resolve

log = logging.getLogger("durable_sandbox.engine")


def new_run_id() -> str:
    return "run-" + uuid.uuid4().hex[:12]


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Engine:
    """Drives durable workflows over a :class:`Store`.

    ``sandbox_factory`` is the extension point behind ``ctx.sandbox`` (wired by ``durable_sandbox.Engine``);
    ``services`` is handed to extensions (providers, hibernation settings).
    """

    def __init__(
        self,
        store: Store,
        *,
        worker_id: str | None = None,
        lease_ttl: float = 30.0,
        inline_sleep_limit: float = 5.0,
        sandbox_factory: Callable[..., Any] | None = None,
        services: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id or default_worker_id()
        self.lease_ttl = lease_ttl
        self.inline_sleep_limit = inline_sleep_limit
        self.sandbox_factory = sandbox_factory
        self.services: dict[str, Any] = services or {}
        self._tasks: dict[str, asyncio.Task[Any]] = {}  # run id -> workflow task driven here
        self._background: dict[str, asyncio.Task[Any]] = {}  # runs started here with `start`
        self.driven: set[str] = set()  # runs this engine executed (to hibernate on close if they wait)

    # ------------------------------------------------------------------ creating and driving runs

    async def create(
        self,
        workflow: Any,
        input: Any = None,
        *,
        run_id: str | None = None,
        thread_id: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> RunRecord:
        """Record a new run (status pending) without executing it; idempotent for the same id and input."""
        definition = definition_of(workflow)
        data = to_jsonable(input, what="The workflow input")
        try:
            definition.prepare_input(data)  # reject bad input before a run exists, not when it executes
        except ValueError as exc:
            raise InvalidInput(f"Input for workflow {definition.name!r} is invalid: {exc}") from None
        run = RunRecord(
            run_id=run_id or new_run_id(),
            workflow=definition.name,
            input=data,
            thread_id=thread_id,
            labels=labels or {},
            workflow_ref=definition.ref,
        )
        stored, created = await self.store.create_run(run)
        if not created and (stored.workflow != run.workflow or stored.input != run.input):
            raise RunConflict(
                f"Run id {run.run_id!r} already exists for workflow {stored.workflow!r} with another input; "
                f"use a new run id, or `resume` the existing run."
            )
        return stored

    async def run(
        self,
        workflow: Any,
        input: Any = None,
        *,
        run_id: str | None = None,
        thread_id: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> RunState:
        """Start (or continue) a run and drive it until it finishes or waits."""
        definition = definition_of(workflow)
        run = await self.create(definition, input, run_id=run_id, thread_id=thread_id, labels=labels)
        return await self._drive(run.run_id, definition)

    async def start(self, workflow: Any, input: Any = None, **kwargs: Any) -> str:
        """Create a run and drive it in the background of this process; returns its run id."""
        definition = definition_of(workflow)
        run = await self.create(definition, input, **kwargs)
        task = asyncio.create_task(self._drive(run.run_id, definition), name=run.run_id)
        self._background[run.run_id] = task
        task.add_done_callback(lambda _: self._background.pop(run.run_id, None))
        return run.run_id

    async def resume(self, run_id: str) -> RunState:
        """Drive an existing run again: after a crash, a signal, a due timer, or to retry a failed run."""
        return await self._drive(run_id, None)

    async def wait(self, run_id: str) -> RunState:
        """Wait for a run started in this process with :meth:`start` to finish or wait."""
        task = self._background.get(run_id)
        if task is not None:
            await asyncio.shield(task)
        return await self.inspect(run_id)

    async def _drive(self, run_id: str, definition: WorkflowDefinition | None) -> RunState:
        run = await self._get(run_id)
        if run.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED):
            return build_state(run, await self.store.load_journal(run_id))
        self.driven.add(run_id)
        while True:
            lease = await self.store.claim(run_id, self.worker_id, self.lease_ttl)
            try:
                rows = await self._execute(lease, definition)
            finally:
                with contextlib.suppress(Exception):
                    await self.store.release(lease)
            if rows is None:
                return await self.inspect(run_id)
            run = await self._get(run_id)
            if run.status != RunStatus.PENDING:
                # The journal is already in memory: build the state from it rather than reading it again.
                return self._state(run, rows)
            # A signal raced the run into "waiting": it is runnable again, so go on driving it.

    async def _execute(self, lease: Lease, definition: WorkflowDefinition | None) -> list[OperationRecord] | None:
        """Execute the run once under ``lease``; returns its journal rows (None if nothing ran)."""
        store = self.store
        run = await self._get(lease.run_id)
        if run.status.terminal and run.status != RunStatus.FAILED:
            return None
        if run.cancel_requested:
            await self._finish_cancelled(lease, run)
            return None
        if definition is None:
            try:
                definition = resolve_run_workflow(run)
            except WorkflowNotFound as exc:
                # Failing (rather than leaving it runnable) stops workers from claiming it forever;
                # `resume` retries it once the code is importable.
                await store.update_run(
                    run.run_id, {"status": RunStatus.FAILED, "error": ErrorInfo.from_exception(exc)}, fence=lease.fence
                )
                raise
        epoch = run.epoch + 1 if run.status == RunStatus.FAILED else run.epoch
        rt = await self.open_runtime(run, lease, epoch=epoch, signals=await store.get_signals(run.run_id))
        rows = rt.rows
        await store.update_run(
            run.run_id,
            {"status": RunStatus.RUNNING, "epoch": epoch, "wake_at": None, "pending_callbacks": [], "error": None},
            fence=lease.fence,
        )
        rt.emit("run.resumed" if rows else "run.started", workflow=run.workflow, worker=self.worker_id)
        ctx = Context(rt)
        wf: asyncio.Task[Any] = asyncio.create_task(_call_workflow(definition, ctx, run.input), name=run.run_id)
        self._tasks[run.run_id] = wf
        keeper = asyncio.create_task(self._keep_lease(lease, rt, wf))
        changes: dict[str, Any]
        try:
            try:
                result = await wf
                rt.check_all_reached()  # raises NonDeterminismError for a recorded op the code skipped
            except Suspend as s:
                await rt.drain()
                pending = rt.pending_callbacks()
                changes = {
                    "status": RunStatus.WAITING,
                    "wake_at": self._wake_at(rt, s),
                    "pending_callbacks": [p["id"] for p in pending],
                }
                rt.emit("run.waiting", callbacks=[p["id"] for p in pending], wakeAt=changes["wake_at"])
            except asyncio.CancelledError:
                reason = await rt.cancel_requested()
                if reason is None:
                    # Interrupted, not cancelled (Ctrl-C, SIGTERM, shutdown): sandbox sessions have
                    # hibernated; the run goes back to pending, resumable here or by any worker.
                    await self._interrupted(lease, rt)
                    raise
                changes = {"status": RunStatus.CANCELLED, "error": ErrorInfo("RunCancelled", reason)}
                rt.emit("run.cancelled", reason=reason)
            except LeaseLost:
                log.warning("lost the lease on run %s; stopping without writing", run.run_id)
                return None
            except Exception as exc:
                rt.draining = True
                await rt.drain()
                changes = {"status": RunStatus.FAILED, "error": ErrorInfo.from_exception(exc)}
                rt.emit("run.failed", error=str(exc))
            else:
                changes = {
                    "status": RunStatus.SUCCEEDED,
                    "result": to_jsonable(result, what=f"The result of workflow {run.workflow!r}"),
                }
                rt.emit("run.succeeded")
            after_run = self.services.get("after_run")
            if after_run is not None and changes["status"] in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.SUCCEEDED):
                await after_run(rt, changes["status"])
            final = rt.pending_records()
            await store.commit(run.run_id, lease.fence, Commit(final, run=changes, thread_state=rt.state_change()))
            rt.rows.extend(final)
            if changes["status"] == RunStatus.WAITING and changes["pending_callbacks"]:
                signals = await store.get_signals(run.run_id)
                if any(cb in signals for cb in changes["pending_callbacks"]):
                    await store.update_run(run.run_id, {"status": RunStatus.PENDING}, fence=lease.fence)
            await rt.flush_events()
            return rt.rows
        finally:
            keeper.cancel()
            self._tasks.pop(run.run_id, None)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keeper

    async def _interrupted(self, lease: Lease, rt: RunRuntime) -> None:
        rt.emit("run.interrupted", worker=self.worker_id)
        try:
            await self.store.commit(rt.run_id, lease.fence, Commit(rt.pending_records(), run={"status": RunStatus.PENDING}))
            await rt.flush_events()
        except LeaseLost:
            pass  # another worker has it already

    async def open_runtime(
        self, run: RunRecord, lease: Lease, *, epoch: int | None = None, signals: dict[str, Any] | None = None
    ) -> RunRuntime:
        """The journal of ``run`` opened for writing under ``lease`` (workflow execution, cleanup, hibernation)."""
        return RunRuntime(
            store=self.store,
            run_id=run.run_id,
            workflow=run.workflow,
            fence=lease.fence,
            epoch=run.epoch if epoch is None else epoch,
            rows=await self.store.load_journal(run.run_id),
            signals=signals or {},
            thread_id=run.thread_id,
            thread_state=(await self.store.get_thread_state(run.thread_id)) if run.thread_id else None,
            sandbox_factory=self.sandbox_factory,
            inline_sleep_limit=self.inline_sleep_limit,
            services=self.services,
        )

    def _wake_at(self, rt: RunRuntime, s: Suspend) -> float | None:
        times = [s.wake_at] if s.wake_at is not None else []
        for rec in rt.latest.values():
            if rec.status == "started" and rec.meta:
                for key in ("deadline", "wakeAt"):
                    if rec.meta.get(key) is not None:
                        times.append(float(rec.meta[key]))
        return min(times) if times else None

    async def _keep_lease(self, lease: Lease, rt: RunRuntime, wf: asyncio.Task[Any]) -> None:
        """Renew the lease and notice cancellation requested from another process."""
        interval = max(self.lease_ttl / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                lease = await self.store.renew(lease, self.lease_ttl)
            except LeaseLost:
                log.error("lease on run %s lost; cancelling its execution here", lease.run_id)
                wf.cancel()
                return
            run = await self.store.get_run(lease.run_id)
            if run is not None and run.cancel_requested and rt.cancel_reason is None:
                rt.cancel_reason = run.cancel_requested
                wf.cancel()

    async def _finish_cancelled(self, lease: Lease, run: RunRecord) -> None:
        """Cancel a run that is not executing: finalize its sandboxes from the journal, then mark it."""
        cleanup = self.services.get("cancel_cleanup")
        if cleanup is not None:
            await cleanup(self, run, lease)
        await self.store.commit(
            run.run_id,
            lease.fence,
            Commit(
                [],
                run={"status": RunStatus.CANCELLED, "error": ErrorInfo("RunCancelled", run.cancel_requested or "")},
            ),
        )

    # ------------------------------------------------------------------ control

    async def signal(self, run_id: str, callback_id: str, value: Any = None) -> bool:
        """Deliver ``value`` to callback ``callback_id``. Idempotent for the same value; a different
        value for an already-signalled callback raises ``SignalConflict``. Returns True if new.
        A signal for a callback the run has not reached yet is kept and delivered when it does."""
        await self._get(run_id)
        data = to_jsonable(value, what="The signal value")
        new = await self.store.put_signal(run_id, callback_id, data)
        # Read the run only after the signal is stored: either this sees the run waiting on it, or the
        # executing worker (which re-reads signals after recording "waiting") sees the signal.
        run = await self._get(run_id)
        if run.status == RunStatus.WAITING and callback_id in run.pending_callbacks:
            await self.store.update_run(run_id, {"status": RunStatus.PENDING})
        await self.store.append_events([Event(run_id, "signal.received", {"callbackId": callback_id})])
        return new

    async def cancel(self, run_id: str, reason: str = "cancelled by user") -> RunState:
        """Cancel a run: the running step is cancelled, sandbox cleanup runs, status becomes cancelled."""
        run = await self._get(run_id)
        if run.status.terminal:
            return await self.inspect(run_id)
        await self.store.update_run(run_id, {"cancel_requested": reason})
        task = self._tasks.get(run_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), timeout=self.lease_ttl)
            return await self.inspect(run_id)
        # Not executing here. A waiting or pending run has nothing in flight: take its lease and
        # drive it once, so that its cleanup (sandbox finalization) runs before it is marked cancelled.
        try:
            await self._drive_cancel(run_id)
        except Exception as exc:  # held by another worker: that worker notices through its lease loop
            log.info("run %s is executing elsewhere; cancellation requested (%s)", run_id, exc)
        return await self.inspect(run_id)

    async def hibernate(self, run_id: str) -> bool:
        """Hibernate the sandboxes of a waiting run now (snapshot and destroy them); True if it ran."""
        hook = self.services.get("hibernate_run")
        run = await self._get(run_id)
        if hook is None or run.status != RunStatus.WAITING:
            return False
        lease = await self.store.claim(run_id, self.worker_id, self.lease_ttl)
        try:
            await hook(self, run, lease)
        finally:
            with contextlib.suppress(Exception):
                await self.store.release(lease)
        return True

    async def hibernate_idle(self, older_than: float) -> list[str]:
        """Hibernate the sandboxes of runs that have been waiting longer than ``older_than`` seconds."""
        done = []
        cutoff = time.time() - older_than
        for run in await self.store.list_runs(status=[RunStatus.WAITING], limit=1000):
            if run.updated_at > cutoff:
                continue
            try:
                if await self.hibernate(run.run_id):
                    done.append(run.run_id)
            except LeaseHeld:
                continue  # someone is working on it; it is not idle
        return done

    async def _drive_cancel(self, run_id: str) -> None:
        lease = await self.store.claim(run_id, self.worker_id, self.lease_ttl)
        try:
            run = await self._get(run_id)
            if not run.status.terminal:
                await self._finish_cancelled(lease, run)
        finally:
            with contextlib.suppress(Exception):
                await self.store.release(lease)

    # ------------------------------------------------------------------ reading

    async def _get(self, run_id: str) -> RunRecord:
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    async def inspect(self, run_id: str) -> RunState:
        run = await self._get(run_id)
        return self._state(run, await self.store.load_journal(run_id))

    @staticmethod
    def _state(run: RunRecord, rows: list[OperationRecord]) -> RunState:
        state = build_state(run, rows)
        if run.status not in (RunStatus.WAITING, RunStatus.PENDING, RunStatus.RUNNING):
            state.pending_callbacks = []
        return state

    async def history(self, run_id: str) -> list[OperationRecord]:
        await self._get(run_id)
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
        await self._get(run_id)
        settled = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.WAITING)

        async def done() -> bool:
            return not follow or (await self._get(run_id)).status in settled

        async def pause() -> None:
            await asyncio.sleep(poll_interval)

        async for event in tail(self.store, run_id, done=done, pause=pause):
            yield event

    # ------------------------------------------------------------------ workers

    async def worker(
        self,
        *,
        concurrency: int = 4,
        poll_interval: float = 0.5,
        workflows: Sequence[str] | None = None,
        stop: asyncio.Event | None = None,
        idle_exit: bool = False,
    ) -> None:
        """Claim runnable runs (pending, due, or orphaned by a dead worker) and execute them."""
        stop = stop or asyncio.Event()
        running: set[asyncio.Task[Any]] = set()
        hibernate_after = self.services.get("hibernate_after")
        next_sweep = 0.0
        while not stop.is_set():
            if hibernate_after is not None and "hibernate_run" in self.services and time.time() >= next_sweep:
                next_sweep = time.time() + max(1.0, min(float(hibernate_after) / 2, 30.0))
                await self.hibernate_idle(float(hibernate_after))
            lease = None
            if len(running) < concurrency:
                lease = await self.store.claim_next(self.worker_id, self.lease_ttl, workflows=workflows)
            if lease is not None:
                task = asyncio.create_task(self._run_claimed(lease))
                running.add(task)
                task.add_done_callback(running.discard)
                continue
            if idle_exit and not running:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_interval)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _run_claimed(self, lease: Lease) -> None:
        try:
            await self._execute(lease, None)
        except Exception:
            log.exception("worker %s failed executing run %s", self.worker_id, lease.run_id)
        finally:
            with contextlib.suppress(Exception):
                await self.store.release(lease)

    async def aclose(self) -> None:
        """Stop runs started here in the background; they stay runnable for another worker."""
        tasks = list(self._background.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ sync wrappers

    def run_sync(self, workflow: Any, input: Any = None, **kwargs: Any) -> RunState:
        return asyncio.run(self.run(workflow, input, **kwargs))

    def inspect_sync(self, run_id: str) -> RunState:
        return asyncio.run(self.inspect(run_id))



def resolve_run_workflow(run: RunRecord) -> WorkflowDefinition:
    """By registered name, else by the import path recorded when the run was created."""
    try:
        return resolve(run.workflow)
    except WorkflowNotFound:
        if not run.workflow_ref or run.workflow_ref == run.workflow:
            raise
        definition = resolve(run.workflow_ref)
        if definition.name != run.workflow:
            raise WorkflowNotFound(
                f"Run {run.run_id!r} is of workflow {run.workflow!r}, but {run.workflow_ref} is now registered as "
                f"{definition.name!r}; restore the name or start a new run."
            ) from None
        return definition


async def _call_workflow(definition: WorkflowDefinition, ctx: Context, raw_input: Any) -> Any:
    # Input validation happens inside the task so that a failure fails the run (it never hangs in "running").
    return await definition.fn(ctx, *definition.prepare_input(raw_input))
