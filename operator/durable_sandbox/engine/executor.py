"""The worker side of the engine: execute a run under its lease.

A run is executed by re-executing the workflow function from the top; the journal makes every
completed operation return its recorded result, so "resume" and "replay" are the same thing.

Where runs come from is not decided here: ``Engine.run``/``resume`` drive one run, the SQLite poller
(:func:`engine.sources.poll_store`, behind ``dsb worker``) claims runnable runs, and the operator
executes the run of each Workflow its kopf daemon drives. Whatever the source, a run already
executing in this process is never claimed a second time by it (engine/in_process.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import replace
from typing import Any, Literal, Protocol

from durable_sandbox.engine.builds import WorkerBuild, build_labels
from durable_sandbox.engine.children import ChildRuns, after_run
from durable_sandbox.engine.client import require_run, state_of
from durable_sandbox.engine.context import Context
from durable_sandbox.engine.continue_as_new import ContinueAsNew, NextRun
from durable_sandbox.engine.endings import Ending
from durable_sandbox.engine.errors import (
    AlreadyExecuting,
    LeaseHeld,
    NotRunnableHere,
    RunNotFinished,
    WorkflowNotFound,
)
from durable_sandbox.engine.extensions import GENERIC_JOURNAL, Extensions, JournalReader
from durable_sandbox.engine.in_process import ExecutingHere
from durable_sandbox.engine.lease_keeper import LeaseKeeper, SystemClock, keep_lease
from durable_sandbox.engine.observed_store import ObservedStore
from durable_sandbox.engine.owner import holder_is_dead, new_worker_id
from durable_sandbox.engine.records import Commit, ErrorInfo, Lease, OperationRecord, RunRecord, RunStatus
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.state import RunState, build_state
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.traced import traced_attempt
from durable_sandbox.engine.workflow import WorkflowDefinition, resolve

log = logging.getLogger("durable_sandbox.engine")

# What to do with a run whose workflow this process cannot import: "leave" it untouched for a process that
# can (`dsb` started in the project's directory, another operator replica with the code) and raise
# NotRunnableHere, or "fail" it (an embedder with one worker that wants the run to say so).
Unresolvable = Literal["fail", "leave"]


class RunHooks(Protocol):
    """What the engine calls at a run's turning points, for the resources ``ctx.sandbox`` holds (the sandbox
    sessions: ``sandboxes.factory.SessionFactory``)."""

    async def after_run(self, rt: RunRuntime, status: RunStatus) -> None:
        """The run ends ``status`` (its final commit follows): release what only a success keeps."""

    async def cancel_cleanup(self, executor: RunExecutor, run: RunRecord, lease: Lease) -> None:
        """Finalize what the run holds, from its journal, without its workflow code (a cancel of a run that
        does not execute, a deletion, the finalizer)."""

    async def hibernate_run(self, executor: RunExecutor, run: RunRecord, lease: Lease) -> None:
        """The run waits: give back what costs while it waits (snapshot and destroy its sandboxes)."""


def default_worker_id() -> str:
    """``<host>:<pid>:<process start>:<nonce>``: names this process for good (see engine/owner.py)."""
    return new_worker_id()


class RunExecutor:
    """Executes runs of ``store`` under leases held by ``worker_id``.

    ``sandbox_factory`` is the extension point behind ``ctx.sandbox``, ``hooks`` what the engine calls of
    it at a run's turning points and ``reader`` how its records read (engine/extensions.py); ``extensions`` are the values handed to extensions
    above the engine, one per type; ``hibernate_after`` how long a waiting run keeps its sandboxes (None:
    the sessions' own default).

    One execution's ending is engine/endings.py's, its lease keeper engine/lease_keeper.py's, and which runs
    execute in this process engine/in_process.py's.
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
        self.store = store
        self.worker_id = worker_id or default_worker_id()
        self.lease_ttl = lease_ttl
        self.inline_sleep_limit = inline_sleep_limit
        self.sandbox_factory = sandbox_factory
        self.hooks = hooks
        self.reader = reader
        self.hibernate_after = hibernate_after
        self.children = ChildRuns(self)  # child workflows driven here; also what a run's end does to its relatives
        self.extensions = Extensions([*extensions, self.children])
        self.unresolvable: Unresolvable = unresolvable
        self.here = ExecutingHere()
        self.driven: set[str] = set()  # runs this process executed (to hibernate on close if they wait)

    # ------------------------------------------------------------------ the in-process guard

    def is_executing(self, run_id: str) -> bool:
        """True while this process holds (or is taking) the run's lease to execute it."""
        return self.here.is_executing(run_id)

    @contextlib.asynccontextmanager
    async def _leased(self, run_id: str) -> AsyncIterator[Lease]:
        """The run's lease for this worker (``claim``) while the block runs, released after it."""
        lease = await self.claim(run_id)
        try:
            yield lease
        finally:
            with contextlib.suppress(Exception):
                await self.store.release(lease)

    # ------------------------------------------------------------------ driving

    async def drive(
        self, run_id: str, definition: WorkflowDefinition | None = None, *, if_busy: Literal["wait", "skip"] = "wait"
    ) -> RunState | None:
        """Execute the run until it finishes or waits (claiming its lease each time); a signal that
        races the run into waiting makes it runnable again, so driving goes on.

        If this process is executing the run already, ``if_busy="wait"`` waits for that to end and
        then drives it; ``"skip"`` returns None at once (a duplicate event from a run source).
        """
        async with self.here.exclusive(run_id, wait=if_busy == "wait") as mine:
            if not mine:
                return None
            run = await self._get(run_id)
            if run.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED):
                return build_state(run, await self.store.load_journal(run_id), self.reader)
            self.driven.add(run_id)
            while True:
                async with self._leased(run_id) as lease:
                    rows = await self.execute(lease, definition)
                if rows is None:
                    return state_of(await self._get(run_id), await self.store.load_journal(run_id), self.reader)
                run = await self._get(run_id)
                await self.children.ended(run)
                if run.status != RunStatus.PENDING:
                    # The journal is already in memory: build the state from it rather than reading it again.
                    return state_of(run, rows, self.reader)

    async def claim(self, run_id: str) -> Lease:
        """The run's lease for this worker. A lease held by a process of this host that has died (a
        crash, SIGKILL) is taken over at once rather than after its TTL; a live holder, or one on
        another host, is never displaced (``LeaseHeld`` says for how long it holds the lease)."""
        try:
            return await self.store.claim(run_id, self.worker_id, self.lease_ttl)
        except LeaseHeld as held:
            if not holder_is_dead(held.owner):
                raise
            log.warning("run %s: its lease holder %s is dead; taking the run over", run_id, held.owner)
            return await self.store.claim(run_id, self.worker_id, self.lease_ttl, take_over_from=held.owner)

    async def run_claimed(self, lease: Lease) -> NotRunnableHere | None:
        """Execute a run whose lease a run source claimed for this worker, then release the lease.

        A run whose workflow this process cannot import is returned as ``NotRunnableHere`` with its lease
        kept (not renewed): released, the source would be handed the same run again at once; kept, it runs
        out after the lease's TTL, the run unchanged and claimable by any worker (the source may release it
        sooner, when it stops)."""
        async with self.here.exclusive(lease.run_id, wait=False) as mine:
            if not mine:
                # Already executing here: this claim advanced the fence past the execution's, so give
                # it back at once (release is fenced: it only clears this claim).
                with contextlib.suppress(Exception):
                    await self.store.release(lease)
                return None
            self.driven.add(lease.run_id)
            not_runnable = None
            try:
                await self.execute(lease, None)
                await self.children.ended(await self._get(lease.run_id))
            except NotRunnableHere as exc:
                not_runnable = exc
            except Exception:
                log.exception("worker %s failed executing run %s", self.worker_id, lease.run_id)
            finally:
                if not_runnable is None:
                    with contextlib.suppress(Exception):
                        await self.store.release(lease)
            return not_runnable

    async def execute(self, lease: Lease, definition: WorkflowDefinition | None) -> list[OperationRecord] | None:
        """Execute the run once under ``lease``, from the fenced start to the commit of how it ended
        (engine/endings.py); returns its journal rows (None if nothing ran)."""
        run = await self._get(lease.run_id)
        if run.status.terminal and run.status != RunStatus.FAILED:
            return None
        if run.cancel_requested:
            await self.finish_cancelled(lease, run)
            return None
        if definition is None:
            definition = await definition_of(self.store, run, lease, self.unresolvable)
        # The build that starts the run is recorded with it (PinnedToBuild: the run is another build's).
        pinned = build_labels(run, definition, self.extensions.get(WorkerBuild))
        pin: dict[str, Any] = {} if pinned is None else {"labels": pinned}
        run = run if pinned is None else replace(run, labels=pinned)
        epoch = run.epoch + 1 if run.status == RunStatus.FAILED else run.epoch
        rt = await self.open_runtime(run, lease, epoch=epoch, signals=await self.store.get_signals(run.run_id))
        await self.store.update_run(
            run.run_id,
            {"status": RunStatus.RUNNING, "epoch": epoch, "wake_at": None, "pending_callbacks": [], "error": None,
             **pin},
            fence=lease.fence,
        )
        rt.emit("run.resumed" if rt.rows else "run.started", workflow=run.workflow, worker=self.worker_id)
        observed = self.store if isinstance(self.store, ObservedStore) else None  # a worker's metrics
        lease_keeper = LeaseKeeper(self.store.renew, lease, self.lease_ttl, SystemClock(),
                                   gave_up=observed.gave_up if observed is not None else None)
        await lease_keeper.start()  # the workflow starts on a lease renewed within the last interval
        nxt = NextRun()  # the run this one continues as, if it does (ctx.continue_as_new)
        wf: asyncio.Task[Any] = asyncio.create_task(_call_workflow(definition, Context(rt), run, nxt), name=run.run_id)
        ending = Ending(self.store, run, lease, rt, worker_id=self.worker_id,
                        after_run=functools.partial(after_run, self.children, self.hooks), next_run=nxt)
        keeper = asyncio.create_task(keep_lease(lease_keeper, self.store, rt, wf, lambda: self.here.cancel_once(run.run_id, wf)))
        try:
            with self.here.running(rt, wf):
                return await ending.settle(wf)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keeper

    def hand_over(self, run_id: str, why: str) -> bool:
        """Stop executing ``run_id`` here at its next operation boundary (the operation in flight
        completes and is committed first) and leave it runnable with its sandboxes live (the next
        worker re-attaches to them); False if it does not execute here."""
        return self.here.hand_over(run_id, why)

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
            extensions=self.extensions,
            hibernate_after=self.hibernate_after,
        )

    # ------------------------------------------------------------------ cancel and hibernation

    async def cancel_here(self, run_id: str, reason: str) -> bool:
        """Cancel the run's execution in this process (cleanup runs in it); False if it does not execute here."""
        task = self.here.tasks.get(run_id)
        if task is None:
            return False
        self.here.cancel_once(run_id, task)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(task), timeout=self.lease_ttl)
        return True

    async def finish_cancelled(self, lease: Lease, run: RunRecord) -> None:
        """Cancel a run that is not executing: its children cancelled, its sandboxes finalized from the journal,
        then it is marked."""
        await self.children.cancel_children(run.run_id, await self.store.load_journal(run.run_id), run.cancel_requested)
        if self.hooks is not None:
            await self.hooks.cancel_cleanup(self, run, lease)
        await self.store.commit(
            run.run_id,
            lease.fence,
            Commit(
                [],
                run={"status": RunStatus.CANCELLED, "error": ErrorInfo("RunCancelled", run.cancel_requested or "")},
            ),
        )
        await self.children.ended(await self._get(run.run_id))

    async def drive_cancel(self, run_id: str) -> None:
        """Take the lease of a run that is not executing and finish its cancellation (cleanup included)."""
        async with self.here.exclusive(run_id, wait=True), self._leased(run_id) as lease:
            run = await self._get(run_id)
            if not run.status.terminal:
                await self.finish_cancelled(lease, run)

    async def expire(self, run_id: str, reason: str) -> None:
        """A failed run that was to be retried, past its deadline (engine/driver.py): under its lease, finalize
        what is left of its sandboxes and mark it cancelled with ``reason`` instead of retrying it."""
        async with self.here.exclusive(run_id, wait=True), self._leased(run_id) as lease:
            run = await self._get(run_id)
            if run.status == RunStatus.FAILED:
                await self.finish_cancelled(lease, replace(run, cancel_requested=reason))

    async def delete(self, run_id: str) -> None:
        """Delete a finished run from the store. Under its lease, any sandbox session its journal does not
        show as finalized is finalized first; if that cleanup fails the run is kept (its journal is what
        finds the sandbox again) and the error propagates."""
        async with self.here.exclusive(run_id, wait=False) as mine:
            if not mine:
                raise AlreadyExecuting(run_id)
            lease = await self.store.claim(run_id, self.worker_id, self.lease_ttl)
            try:
                run = await self._get(run_id)
                if not run.status.terminal:  # it moved on (a resume) since the caller looked
                    raise RunNotFinished(run_id, run.status.value)
                if self.hooks is not None:
                    await self.hooks.cancel_cleanup(self, run, lease)
                await self.store.delete_run(run_id, fence=lease.fence)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.store.release(lease)
                raise

    async def hibernate(self, run_id: str) -> bool:
        """Hibernate the sandboxes of a waiting run now (snapshot and destroy them); True if it ran."""
        hooks = self.hooks
        run = await self._get(run_id)
        if hooks is None or run.status != RunStatus.WAITING:
            return False
        async with self.here.exclusive(run_id, wait=False) as mine:
            if not mine:
                return False  # executing here: it is not idle
            async with self._leased(run_id) as lease:
                await hooks.hibernate_run(self, run, lease)
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

    async def _get(self, run_id: str) -> RunRecord:
        return await require_run(self.store, run_id)


async def definition_of(store: Store, run: RunRecord, lease: Lease, unresolvable: Unresolvable) -> WorkflowDefinition:
    """The run's workflow, imported by this process: NotRunnableHere if it cannot be and unresolvable runs
    are left for another process, else the run fails (``resume`` retries it once the code is importable)."""
    try:
        return resolve_run_workflow(run)
    except WorkflowNotFound as exc:
        if unresolvable == "leave":
            raise NotRunnableHere(run.run_id, exc, status=run.status.value, module=workflow_module(run)) from exc
        await store.update_run(
            run.run_id, {"status": RunStatus.FAILED, "error": ErrorInfo.from_exception(exc)}, fence=lease.fence
        )
        raise


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


def workflow_module(run: RunRecord) -> str | None:
    """The module a run's workflow is imported from (``pkg.flows`` of ``pkg.flows:fn``), if it was recorded."""
    for ref in (run.workflow_ref, run.workflow):
        if ref and ":" in ref:
            return ref.partition(":")[0]
    return None


def _call_workflow(definition: WorkflowDefinition, ctx: Context, run: RunRecord,
                   nxt: NextRun) -> Coroutine[Any, Any, Any]:
    """The workflow's coroutine for one execution of ``run``, in its attempt's span when tracing is on."""

    async def call() -> Any:
        # Input validation happens inside the task so that a failure fails the run (it never hangs in "running").
        try:
            return await definition.fn(ctx, *definition.prepare_input(run.input))
        except ContinueAsNew as c:  # the run ends here, its result naming the next run (engine/continue_as_new.py)
            return await nxt.prepare(ctx.operations.store, c)

    return traced_attempt(ctx.operations, run, call())
