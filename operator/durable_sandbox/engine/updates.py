"""Queries and updates of a run (``Engine.query``/``update``, ``RunClient.query``/``update``, ``dsb query``/``update``).

A **query** calls a handler the workflow registered with ``ctx.query_handler``: on the live state when the run
executes in this process, else on a read-only replay of its journal (engine/readonly.py). It takes no lease,
executes nothing and writes nothing, so it never blocks the run and never changes its journal.

An **update** calls a handler registered with ``ctx.update_handler`` and journals it, exactly once:

1. an update id already in the journal returns its recorded result (a retry; another name or input for the
   same id is ``UpdateConflict``);
2. otherwise, under the run's lease (an update is applied between executions, never while the run executes:
   it waits up to ``wait`` seconds for a live holder to let go), the run is replayed read-only to its
   frontier, every recorded update applied; the input is validated (the handler's parameter annotation, its
   validator); the handler runs; its result is committed as one ``update`` record, fenced by the lease;
3. only then is the result returned.

A refused update (no such handler, input that does not validate, a validator or handler that raises, a
finished run) raises ``UpdateRefused`` saying why, and journals nothing. A crash before the commit leaves
nothing (the handler's change was only in the replay's memory); after it, a retry with the same id returns
the recorded result. Executions of the run apply recorded updates as they replay (engine/run_handlers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine import faults
from durable_sandbox.engine.client import require_run
from durable_sandbox.engine.errors import LeaseHeld, QueryRefused, UpdateConflict, UpdateRefused
from durable_sandbox.engine.executor import resolve_run_workflow
from durable_sandbox.engine.in_process import ExecutingHere
from durable_sandbox.engine.owner import holder_is_dead
from durable_sandbox.engine.readonly import replay_read_only
from durable_sandbox.engine.records import Commit, Event, Lease, OperationRecord, OpStatus, RunRecord
from durable_sandbox.engine.run_handlers import UPDATE, RunHandlers, update_op_id
from durable_sandbox.engine.serialization import to_jsonable, value_digest
from durable_sandbox.engine.store import Store
from durable_sandbox.engine.workflow import WorkflowDefinition

UPDATE_WAIT_SECONDS = 60.0  # how long an update waits for a live worker executing the run to let go
_POLL = 0.2


@dataclass(frozen=True)
class UpdateOutcome:
    """An update's answer: the handler's result (JSON), its id, and whether this call applied it (False: it
    had been applied before, by a call with the same id)."""

    update_id: str
    result: Any
    new: bool

    def to_json(self) -> dict[str, Any]:
        return {"updateId": self.update_id, "result": self.result, "new": self.new}


@dataclass(frozen=True)
class RunHandlerAccess:
    """What answering queries and applying updates needs: the store, who takes leases, and the runs
    executing in this process (their live handlers answer queries; an update waits for their execution)."""

    store: Store
    owner: str
    lease_ttl: float = 30.0
    here: ExecutingHere | None = None

    async def query(self, run_id: str, name: str, arg: Any = None) -> Any:
        """The answer of query handler ``name`` of run ``run_id`` (JSON). ``QueryRefused`` says why not."""
        run = await require_run(self.store, run_id)
        live = self.here.runtimes.get(run_id) if self.here is not None else None
        if live is not None and not live.read_only:
            handlers = live.handlers
        else:
            rows = await self.store.load_journal(run_id)
            handlers = (await replay_read_only(self.store, run, rows, _definition(run))).handlers
        handler = handlers.queries.get(name)
        what = f"Query {name!r} of run {run_id!r}"
        if handler is None:
            raise QueryRefused(f"{what}: the workflow {run.workflow!r} registers no query handler {name!r} "
                               f"{_known(handlers.queries)}; register it with ctx.query_handler({name!r}, fn).")
        try:
            value = handler.prepare(arg, what)
        except UpdateRefused as exc:
            raise QueryRefused(str(exc)) from None
        try:
            answer = handler.call(value)
        except Exception as exc:
            raise QueryRefused(f"{what}: its handler raised {type(exc).__name__}: {exc}") from exc
        return to_jsonable(answer, what=f"The answer of query {name!r}")

    async def update(self, run_id: str, name: str, input: Any = None, *, update_id: str | None = None,
                     wait: float = UPDATE_WAIT_SECONDS) -> UpdateOutcome:
        """Apply update ``name`` to run ``run_id`` once (see the module); ``UpdateRefused`` says why not."""
        uid = update_id or "upd-" + uuid.uuid4().hex[:12]
        data = to_jsonable(input, what=f"The input of update {name!r}")
        digest = value_digest({"name": name, "input": data})
        run = await require_run(self.store, run_id)
        earlier = _applied(await self.store.load_journal(run_id), run_id, uid, digest)
        if earlier is not None:
            return earlier
        _check_open(run, name)
        definition = _definition(run)
        async with self._leased(run_id, wait) as lease:
            run = await require_run(self.store, run_id)
            rows = await self.store.load_journal(run_id)
            earlier = _applied(rows, run_id, uid, digest)  # applied while we waited for the lease
            if earlier is not None:
                return earlier
            _check_open(run, name)
            rt = await replay_read_only(self.store, run, rows, definition)
            result = _apply(rt.handlers, run, name, data)
            record = OperationRecord(update_op_id(uid), UPDATE, name, OpStatus.COMPLETED.value, 1, digest, result,
                                     meta={"input": data}, epoch=run.epoch)
            faults.reach(f"before:{record.op_id}")
            await self.store.commit(run_id, lease.fence, Commit([record]))
            faults.reach(f"after:{record.op_id}")
        with contextlib.suppress(Exception):  # an observer's feed: the update is committed whatever happens here
            await self.store.append_events([Event(run_id, "update.applied", {"updateId": uid, "name": name})])
        return UpdateOutcome(uid, result, True)

    @contextlib.asynccontextmanager
    async def _leased(self, run_id: str, wait: float) -> AsyncIterator[Lease]:
        """The run's lease while the block runs; an execution in this process is waited for first (``wait`` seconds,
        then ``LeaseHeld``)."""
        async with contextlib.AsyncExitStack() as stack:
            if self.here is not None:
                try:
                    await asyncio.wait_for(stack.enter_async_context(self.here.exclusive(run_id, wait=True)), wait)
                except TimeoutError:  # it executes here all that time: said as for a worker elsewhere
                    run = await require_run(self.store, run_id)
                    raise LeaseHeld(run_id, run.lease_owner or self.owner, run.lease_expires_at or time.time()) from None
            lease = await self._claim(run_id, wait)
            try:
                yield lease
            finally:
                with contextlib.suppress(Exception):
                    await self.store.release(lease)

    async def _claim(self, run_id: str, wait: float) -> Lease:
        """Take the lease: a dead holder of this host at once, a live one once it lets go (``LeaseHeld`` after
        ``wait`` seconds: the run executes elsewhere all that time)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                return await self.store.claim(run_id, self.owner, self.lease_ttl)
            except LeaseHeld as held:
                if holder_is_dead(held.owner):
                    return await self.store.claim(run_id, self.owner, self.lease_ttl, take_over_from=held.owner)
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(_POLL)


def _definition(run: RunRecord) -> WorkflowDefinition:
    """The run's workflow, imported by this process (``WorkflowNotFound`` says how to make it importable)."""
    return resolve_run_workflow(run)


def _check_open(run: RunRecord, name: str) -> None:
    if run.status.terminal:
        raise UpdateRefused(f"Update {name!r} of run {run.run_id!r} refused: the run has {run.status.value}; "
                            f"updates go to runs that have not finished (`dsb resume` a failed run first).")


def _applied(rows: list[OperationRecord], run_id: str, update_id: str, digest: str) -> UpdateOutcome | None:
    """The outcome of update ``update_id`` if the journal has it (a retry), else None."""
    op_id = update_op_id(update_id)
    for rec in rows:
        if rec.op_id == op_id and rec.status == OpStatus.COMPLETED.value:
            if rec.input_digest != digest:
                raise UpdateConflict(run_id, update_id)
            return UpdateOutcome(update_id, rec.result, False)
    return None


def _apply(handlers: RunHandlers, run: RunRecord, name: str, data: Any) -> Any:
    """Validate ``data`` and run update handler ``name`` on the replayed state: its result, as JSON."""
    what = f"Update {name!r} of run {run.run_id!r}"
    handler = handlers.updates.get(name)
    if handler is None:
        raise UpdateRefused(f"{what} refused: the workflow {run.workflow!r} registers no update handler {name!r} "
                            f"{_known(handlers.updates)}; register it with ctx.update_handler({name!r}, fn).")
    waiting = handlers.unapplied()
    if waiting:
        raise UpdateRefused(f"{what} refused: earlier updates ({', '.join(waiting)}) are recorded but their "
                            f"handlers are not registered where the run stands now; register them first.")
    value = handler.prepare(data, what)
    try:
        result = handler.call(value)
    except Exception as exc:
        raise UpdateRefused(f"{what} refused: its handler raised {type(exc).__name__}: {exc} (nothing was "
                            f"recorded; the run is unchanged)") from exc
    return to_jsonable(result, what=f"The result of update {name!r}")


def _known(handlers: dict[str, Any]) -> str:
    return f"(it registers: {', '.join(sorted(handlers))})" if handlers else "(it registers none at this point)"
