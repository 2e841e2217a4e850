"""Child workflows: ``ctx.child_workflow`` and ``ctx.start_child`` (a run that starts another run and waits for it).

A child is a run of its own in the same store: its own journal, sandboxes, retries and timeouts. The parent
journals one operation of kind ``child`` per child: a ``started`` record naming the child's run id (written
after the child run exists), then the child's outcome (``completed`` with its result, or ``failed``). So:

- **Never started twice.** The child's run id is derived from the parent's run id and the operation id, and
  creating a run is idempotent by id: a crash between the child's creation and the parent's ``started`` record
  (fault point ``child-created:<op>``) makes the replay create the same run again, which finds it and goes on.
- **Identity is the parent's journal.** What the parent believes of a child comes from the run id its own
  journal recorded, never from a label: the child's ``durable-sandbox.dev/parent`` label only tells the engine
  whom to wake when the child ends, and a forged one wakes a parent that then finds nothing new.
- **Waiting.** In the process that executes the parent, the child is driven in a task of its own (several at
  once for a fan-out). A child that waits (a callback, a long sleep) or executes elsewhere makes the parent
  wait too: the parent's wait is keyed ``child:<child run>:<child epoch>``, the child's end signals that key
  (:meth:`ChildRuns.finished`), and a re-check timer (``RECHECK_SECONDS``) covers a crash between the child's
  final commit and that signal.
- **Cancel.** A parent's cancel requests the cancel of every unfinished child whose policy is ``cancel`` (the
  default) before the parent's own cancel is committed, so a crash in between repeats it; ``abandon`` leaves
  the child running.
- **Failure.** A child that fails or is cancelled raises :class:`ChildWorkflowFailed` in the parent, naming the
  child; a retried parent (a new epoch) resumes the failed child rather than starting another.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from durable_sandbox.engine import faults
from durable_sandbox.engine.client import RunClient
from durable_sandbox.engine.continue_as_new import follow
from durable_sandbox.engine.errors import LeaseHeld, StepFailed, Suspend
from durable_sandbox.engine.records import ErrorInfo, OperationRecord, OpKind, OpStatus, RunRecord, RunStatus
from durable_sandbox.engine.serialization import input_digest, revalidate
from durable_sandbox.engine.workflow import WorkflowDefinition, definition_of

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime
    from durable_sandbox.engine.store import Store

log = logging.getLogger("durable_sandbox.engine")

PARENT_LABEL = "durable-sandbox.dev/parent"
# How often a parent that waits for a child looks again without being woken: the child's end wakes it at
# once; this only covers a crash between the child's final commit and that wake-up.
RECHECK_SECONDS = 60.0
CHILD = OpKind.CHILD.value
COMPLETED = OpStatus.COMPLETED.value
FAILED = OpStatus.FAILED.value
STARTED = OpStatus.STARTED.value
_UNSAFE = re.compile(r"[^A-Za-z0-9_/-]")
_MAX_ID = 200


class _Context(Protocol):
    """What this module reads of ``engine.context.Context`` (which imports this module)."""

    @property
    def scope(self) -> str: ...

    @property
    def operations(self) -> RunRuntime: ...


class _Executor(Protocol):
    """What this module calls of ``engine.executor.RunExecutor`` (which imports this module)."""

    store: Store
    lease_ttl: float

    async def drive(self, run_id: str, definition: WorkflowDefinition | None = None, *,
                    if_busy: Literal["wait", "skip"] = "wait") -> Any: ...

    async def cancel_here(self, run_id: str, reason: str) -> bool: ...

    async def drive_cancel(self, run_id: str) -> None: ...


class _Hooks(Protocol):
    """The part of ``engine.executor.RunHooks`` called at a run's end."""

    async def after_run(self, rt: RunRuntime, status: RunStatus) -> None: ...


@dataclass(frozen=True)
class ChildPlacement:
    """An engine extension: where a child run is created when a run is an object of its own (the operator
    makes each child a ``Workflow``: ``kube/workflow/children.py``). ``create(record, parent_run_id, op_id)``
    creates the child run once (a second call with the same arguments finds what the first made) and returns
    the stored run, whose id may differ from ``record.run_id`` (the cluster names a run after its object); the
    parent journals that id. Without one, the child is created in the store under ``record.run_id``."""

    create: Callable[[RunRecord, str, str], Awaitable[RunRecord]]


class ChildPolicy(enum.StrEnum):
    """What a parent's cancel does to a child that has not finished."""

    CANCEL = "cancel"
    ABANDON = "abandon"


class ChildWorkflowFailed(StepFailed):
    """A child workflow failed or was cancelled; the parent's ``await`` raises this (replays raise it again)."""

    def __init__(self, op_id: str, child_run_id: str, workflow: str, status: str, error_type: str, message: str,
                 attempts: int = 1) -> None:
        super().__init__(op_id, error_type, message, attempts)
        self.child_run_id = child_run_id
        self.workflow = workflow
        self.status = status
        self.args = (
            f"Child workflow {workflow!r} (run {child_run_id!r}, started as {op_id!r}) ended {status}: "
            f"{error_type}: {message}. `dsb inspect {child_run_id}` shows its journal.",
        )

    def info(self) -> ErrorInfo:
        return ErrorInfo(type(self).__name__, str(self), False, {
            "childRunId": self.child_run_id, "workflow": self.workflow, "status": self.status,
            "errorType": self.error_type, "errorMessage": self.cause_message,
        })

    @classmethod
    def from_record(cls, rec: OperationRecord) -> ChildWorkflowFailed:
        d = (rec.error.details if rec.error else None) or {}
        return cls(rec.op_id, str(d.get("childRunId", "?")), str(d.get("workflow", rec.name)),
                   str(d.get("status", "failed")), str(d.get("errorType", "Error")),
                   str(d.get("errorMessage", rec.error.message if rec.error else "")), rec.attempt)


def child_run_id(parent_run_id: str, op_id: str) -> str:
    """The child's run id: the same for the same parent and operation, so a replay finds the run it created.
    ``<parent>.<op id with / as .>`` (``plan.work.p1.child``); an op id with a dot or a character outside
    ``A-Z a-z 0-9 _ -`` gets those as ``-`` and a hash of it, so two op ids never name one child."""
    digest = hashlib.sha256(op_id.encode()).hexdigest()[:8]
    plain = op_id.replace("/", ".")
    safe = _UNSAFE.sub("-", op_id).replace("/", ".")
    tail = plain if "." not in op_id and safe == plain else f"{safe}-{digest}"
    out = f"{parent_run_id}.{tail}"
    return out if len(out) <= _MAX_ID else f"{out[: _MAX_ID - 9]}-{digest}"


def wait_key(child: RunRecord) -> str:
    """The key a parent waits on for ``child``: its end at the epoch it will end with (a failed child that a
    retried parent resumes ends at the next one), so a wake-up for an earlier end never wakes a later wait."""
    epoch = child.epoch + 1 if child.status == RunStatus.FAILED else child.epoch
    return f"child:{child.run_id}:{epoch}"


@dataclass
class ChildHandle:
    """A started child: ``await handle.result()`` for its result (or :class:`ChildWorkflowFailed`)."""

    ctx: _Context
    id: str  # the operation id in the parent (scoped)
    run_id: str  # the child's run id
    definition: WorkflowDefinition

    async def result(self) -> Any:
        return await _result(self)

    async def join(self, ctx: Any) -> Any:
        """``result`` as a branch of ``ctx.parallel`` (a branch that takes ``ctx`` runs as itself, not in a
        step): ``await ctx.parallel("join", [h.join for h in handles])``."""
        return await _result(self)


async def start_child(ctx: _Context, workflow: Any, input: Any = None, *, id: str,
                      policy: ChildPolicy | str = ChildPolicy.CANCEL) -> ChildHandle:
    """Create the child run (once) and journal its start; it begins executing in this process at once."""
    rt = ctx.operations
    definition = definition_of(workflow)
    chosen = ChildPolicy(policy)
    op_id = ctx.scope + id
    digest = input_digest((input,), {})
    run_id = child_run_id(rt.run_id, op_id)
    prev = rt.enter(op_id, CHILD, definition.name, digest)
    handle = ChildHandle(ctx, op_id, run_id, definition)
    if prev is not None:
        # Started before: ``result()`` decides whether the child still needs executing (driving it here now could
        # retry a child whose failure the parent has yet to record).
        recorded = (prev.meta or {}).get("childRunId")
        handle.run_id = str(recorded) if recorded else run_id
        return handle
    client = RunClient(rt.store)
    placement = rt.extensions.get(ChildPlacement)
    if placement is None:
        await client.create(definition, input, run_id=run_id, labels={PARENT_LABEL: rt.run_id})
    else:
        record = client.record(definition, input, run_id=run_id, labels={PARENT_LABEL: rt.run_id})
        run_id = handle.run_id = (await placement.create(record, rt.run_id, op_id)).run_id
    faults.reach(f"child-created:{op_id}")
    await rt.write(
        OperationRecord(op_id, CHILD, definition.name, STARTED, 1, digest,
                        meta={"childRunId": run_id, "policy": chosen.value, "childEpoch": 0}, epoch=rt.epoch),
        check_cancel=True,
    )
    faults.reach(f"child-started:{op_id}")
    _runs(rt).drive_soon(run_id, definition)
    return handle


def _runs(rt: RunRuntime) -> ChildRuns:
    runs = rt.extensions.get(ChildRuns)
    if runs is None:
        raise RuntimeError("child workflows need a run executed by an engine (RunExecutor); this runtime has none.")
    return runs


def _outcome_ready(child: RunRecord, rec: OperationRecord) -> bool:
    if child.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED):
        return True
    return child.status == RunStatus.FAILED and child.epoch >= int((rec.meta or {}).get("childEpoch", 0))


async def _result(handle: ChildHandle) -> Any:
    rt = handle.ctx.operations
    rec = rt.latest[handle.id]
    if rec.status == COMPLETED:
        return revalidate(handle.definition.fn, rec.result)
    if rec.status == FAILED:
        if rec.epoch >= rt.epoch:
            raise ChildWorkflowFailed.from_record(rec)
        rec = await _retry(rt, rec, handle)  # the parent was retried: resume the failed child
    runs = _runs(rt)
    # A child that continued as new ends with the last run of its chain (engine/continue_as_new.py).
    child = await follow(rt.store, await RunClient(rt.store).get(handle.run_id))
    while not _outcome_ready(child, rec):
        driven = child.run_id
        await runs.drive(driven, handle.definition)
        child = await follow(rt.store, await RunClient(rt.store).get(driven))
        if child.run_id == driven:  # it waits (or executes elsewhere); a chain that moved on is driven further
            break
    if not _outcome_ready(child, rec):
        await _wait_for(rt, rec, child)
    return await _record_outcome(rt, rec, child, handle)


async def _wait_for(rt: RunRuntime, rec: OperationRecord, child: RunRecord) -> None:
    """Suspend the parent until the child's end: the key it waits on is journaled with the child operation
    (``meta.waitKey``), so it is among the run's pending callbacks, which the child's end signals."""
    key = wait_key(child)
    if (rec.meta or {}).get("waitKey") != key:
        await rt.write(OperationRecord(rec.op_id, CHILD, rec.name, STARTED, rec.attempt, rec.input_digest,
                                       meta={**(rec.meta or {}), "waitKey": key}, epoch=rt.epoch))
    rt.emit("child.waiting", opId=rec.op_id, childRunId=child.run_id, childStatus=child.status.value)
    raise Suspend([rec.op_id], time.time() + RECHECK_SECONDS)


async def _retry(rt: RunRuntime, rec: OperationRecord, handle: ChildHandle) -> OperationRecord:
    child = await follow(rt.store, await RunClient(rt.store).get(handle.run_id))
    started = OperationRecord(
        handle.id, CHILD, rec.name, STARTED, rec.attempt + 1, rec.input_digest,
        meta={**(rec.meta or {}), "waitKey": None,
              "childEpoch": child.epoch + 1 if child.status == RunStatus.FAILED else child.epoch},
        epoch=rt.epoch,
    )
    await rt.write(started, check_cancel=True)
    return started


async def _record_outcome(rt: RunRuntime, rec: OperationRecord, child: RunRecord, handle: ChildHandle) -> Any:
    faults.reach(f"child-ended:{handle.id}")  # the child has ended; the parent has not recorded it yet
    if child.status == RunStatus.SUCCEEDED:
        await rt.write(OperationRecord(handle.id, CHILD, rec.name, COMPLETED, rec.attempt, rec.input_digest,
                                       child.result, meta=rec.meta, epoch=rt.epoch), boundary=True)
        return revalidate(handle.definition.fn, child.result)
    err = child.error or ErrorInfo("Error", "no error recorded")
    exc = ChildWorkflowFailed(handle.id, child.run_id, child.workflow, child.status.value, err.type, err.message,
                              rec.attempt)
    await rt.write(OperationRecord(handle.id, CHILD, rec.name, FAILED, rec.attempt, rec.input_digest,
                                   error=exc.info(), meta=rec.meta, epoch=rt.epoch))
    raise exc


class ChildRuns:
    """The children this process drives for the runs its executor executes, and what a run's end does to the
    runs related to it (wake a parent, cancel children)."""

    def __init__(self, executor: _Executor) -> None:
        self.executor = executor
        self._tasks: dict[str, asyncio.Task[Any]] = {}

    def drive_soon(self, run_id: str, definition: WorkflowDefinition) -> asyncio.Task[Any]:
        """Execute the child in a task of its own (unless one already does): the parent goes on meanwhile."""
        task = self._tasks.get(run_id)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._drive(run_id, definition), name=run_id)
            self._tasks[run_id] = task
            task.add_done_callback(lambda t: self._tasks.pop(run_id, None) if self._tasks.get(run_id) is t else None)
        return task

    async def drive(self, run_id: str, definition: WorkflowDefinition) -> None:
        """Execute the child until it ends or waits. Shielded: a parent's cancel or interruption does not
        interrupt the child's execution half-way; the parent's cancel cancels the child itself."""
        await asyncio.shield(self.drive_soon(run_id, definition))

    async def _drive(self, run_id: str, definition: WorkflowDefinition) -> None:
        try:
            await self.executor.drive(run_id, definition, if_busy="wait")
        except LeaseHeld:
            log.info("child run %s executes in another process; its parent waits for its end", run_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Its parent reads the child's status from the store: an execution that could not go on (the store
            # away) leaves the child resumable, and the parent waiting for it.
            log.exception("executing child run %s failed", run_id)

    async def aclose(self) -> None:
        """Stop the children executing here (each goes back to ``pending``, resumable by any worker)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def ended(self, run: RunRecord) -> None:
        """After an execution of ``run``: if it has ended (its final commit is in), wake its parent, if it has
        one waiting for this end."""
        parent = run.labels.get(PARENT_LABEL)
        if not parent or not run.status.terminal:
            return
        store = self.executor.store
        key = f"child:{run.run_id}:{run.epoch}"
        run_id = run.run_id
        try:
            await store.put_signal(parent, key, True)
            waiting = await store.get_run(parent)
            if waiting is not None and waiting.status == RunStatus.WAITING and key in waiting.pending_callbacks:
                await store.update_run(parent, {"status": RunStatus.PENDING})
        except Exception as exc:  # the parent's re-check timer finds the end anyway
            log.warning("run %s ended but waking its parent %s failed (%s); it looks again within %.0fs",
                        run_id, parent, exc, RECHECK_SECONDS)

    async def cancel_children(self, parent_run_id: str, rows: Any, reason: str | None) -> None:
        """Cancel every unfinished child of ``rows`` (a parent's journal) whose policy is ``cancel``: the cancel
        is requested in the store first (durable), then carried out here or by whoever executes the child."""
        latest: dict[str, OperationRecord] = {}
        for r in rows:
            if r.kind == CHILD:
                latest[r.op_id] = r
        for rec in latest.values():
            meta = rec.meta or {}
            if rec.status != STARTED or meta.get("policy", ChildPolicy.CANCEL.value) != ChildPolicy.CANCEL.value:
                continue
            await self._cancel(str(meta["childRunId"]), f"its parent {parent_run_id} was cancelled: {reason}")

    async def _cancel(self, run_id: str, reason: str) -> None:
        executor = self.executor
        first = await executor.store.get_run(run_id)
        if first is None:
            return
        run_id = (await follow(executor.store, first)).run_id  # a child that continued as new: its last run
        run = await RunClient(executor.store).request_cancel(run_id, reason)
        if run.status.terminal:
            return
        if await executor.cancel_here(run_id, reason):
            return
        try:
            await executor.drive_cancel(run_id)
        except LeaseHeld:
            log.info("child run %s executes elsewhere; its cancel was requested", run_id)
        task = self._tasks.get(run_id)
        if task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), executor.lease_ttl)


async def after_run(children: ChildRuns, hooks: _Hooks | None, rt: RunRuntime, status: RunStatus) -> None:
    """A run ends ``status`` (its final commit follows): a cancel first cancels its children (so a crash before
    the final commit repeats it), then the run's hooks release what only a success keeps."""
    if status == RunStatus.CANCELLED:
        await children.cancel_children(rt.run_id, rt.known_rows(), rt.cancel_reason)
    if hooks is not None and status.terminal:
        await hooks.after_run(rt, status)


class ChildWorkflows:
    """``ctx.child_workflow`` and ``ctx.start_child``: the context's part for child workflows (a base of
    ``engine.context.Context``, which provides ``scope`` and ``operations``)."""

    __slots__ = ()

    async def child_workflow(self, workflow: Any, input: Any = None, *, id: str,
                             policy: ChildPolicy | str = ChildPolicy.CANCEL) -> Any:
        """Run ``workflow`` as a child run of its own and return its result (:class:`ChildWorkflowFailed` if it
        fails or is cancelled). Journaled here: a replay never starts it twice. ``policy``: what this run's
        cancel does to the child (``cancel`` it, or ``abandon`` it to run on)."""
        return await (await self.start_child(workflow, input, id=id, policy=policy)).result()

    async def start_child(self, workflow: Any, input: Any = None, *, id: str,
                          policy: ChildPolicy | str = ChildPolicy.CANCEL) -> ChildHandle:
        """Start a child run and go on (it executes meanwhile); ``await handle.result()`` later, or join several
        with ``ctx.parallel("join", [h.join for h in handles])``."""
        return await start_child(cast("_Context", self), workflow, input, id=id, policy=policy)
