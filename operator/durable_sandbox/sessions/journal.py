"""The Sandbox's own call journal: calls made to a Sandbox resource directly, journaled like a Workflow's.

A Sandbox's session calls live in one run of its namespace's store (``dsbx.<uid>.calls``, owned by the Sandbox, so
it goes with it), under the session ``calls``: the same records, sealing and machinery as a Workflow's sandbox calls
(``sandboxes/session.py`` attached to the Sandbox's live sandbox, as ``spec.sandboxRef`` does). Each call:

1. runs under the run's lease (the fence: a replica that lost it can never write) and the journal as read when the
   lease was taken; both are kept while calls keep coming and let go after an idle gap (``hold.py``), so a call
   answered by another replica, or before a restart, is known here (no other replica writes while this one holds);
2. a call whose ``operationId`` the journal has completed is answered from the journal and never runs again (the
   same arguments required: an id reused for another call is refused);
3. otherwise it runs, and its one record (``completed``: the call, its place in the order, its result capped as the
   journal keeps it) is committed before it is answered: one journal write per call. No ``started`` record is
   committed before it runs (``SandboxSession.call``'s ``journal_start=False``): a call interrupted by a crash
   leaves nothing, and its retry runs it, which is what a ``started`` record without a completion led to as well
   (a journal written before this change may hold such records: their retry runs the call at its recorded place).

Why the lease is let go after an idle gap rather than kept for the session: a session may sit idle for hours
between calls; holding a run's lease that long would keep every other replica from answering it after a failover
until the lease ran out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine.errors import LeaseHeld, NonDeterminismError
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import Lease, RunRecord, RunStatus
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.serialization import value_digest
from durable_sandbox.kube.sandbox.view import calls_run_id
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider, ToolCall, ToolResult
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.session import SandboxServices, SandboxSession
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.hold import HoldSettings, OpenSession

__all__ = ["SESSION", "SESSION_WORKFLOW", "SandboxRef", "SessionJournal", "calls_run_id"]

log = logging.getLogger("durable_sandbox.sessions")

SESSION = "calls"  # the session id of a Sandbox's own calls in its journal (op ids ``calls/<operationId>``)
SESSION_WORKFLOW = "sandbox-session"  # the run's workflow name: never executed, it names what the run is


@dataclass(frozen=True)
class SandboxRef:
    """A Sandbox resource as the operator recorded it: its name AND uid (a re-created Sandbox is another one)."""

    namespace: str
    name: str
    uid: str

    @property
    def where(self) -> str:
        return f"Sandbox {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Answered:
    result: ToolResult
    replayed: bool  # answered from the journal: the call had completed before this request


class SessionJournal:
    """The call journals of one namespace's Sandboxes, over that namespace's store (API server or PostgreSQL)."""

    def __init__(self, store: Any, *, worker_id: str, lease_ttl: float, owned: bool = True,
                 hold: HoldSettings | None = None) -> None:
        self.store = store
        self.owned = owned  # the run is owned by the Sandbox (its store takes an owner: the operator's stores do)
        self.hold = hold or HoldSettings()
        self._handles: dict[str, SandboxHandle] = {}  # run id -> the live sandbox taken for the call in flight
        self._open: dict[SandboxRef, OpenSession] = {}  # the Sandboxes whose session is open in this process
        self._opening = asyncio.Lock()
        self.executor = RunExecutor(store, worker_id=worker_id, lease_ttl=lease_ttl,
                                    extensions=[SandboxServices(attached=self._attached)])

    async def _attached(self, run_id: str, _name: str) -> SandboxHandle:
        return self._handles[run_id]

    async def call(self, ref: SandboxRef, live: Callable[[], AbstractAsyncContextManager[tuple[SandboxHandle, SandboxProvider]]],
                   call: ToolCall) -> Answered:
        """Run ``call`` in the Sandbox's live sandbox, journaled (see the module's docstring). ``live`` takes the
        Sandbox (its holder) and gives its sandbox and provider: entered under the journal's lease, so two
        replicas never both hold it for calls, and kept with the session while calls keep coming (``hold.py``)."""
        while True:
            session = await self._session(ref)
            async with session.lock:
                if session.closed:
                    continue  # let go meanwhile (idle, lease lost): open it again
                if not session.fresh(self.executor.lease_ttl) and not await session.refresh(self._renew):
                    await self._close(session)  # the lease lost, or not known to be ours: claim it again first
                    continue
                session.in_flight = asyncio.current_task()
                try:
                    done = _completed(ref, session.rt.rows, call)
                    if done is not None:
                        return done
                    handle, provider = await session.live(live)
                    return await self._execute(ref, session.rt, handle, provider, call)
                except CallRefused:
                    if session.handle is None:  # refused before or while taking the Sandbox: hold nothing
                        await self._close(session)
                    raise
                except BaseException:
                    await self._close(session)  # the next call starts afresh
                    raise
                finally:
                    session.in_flight = None
                    session.last_used = time.monotonic()
                    if self.hold.idle_seconds <= 0:
                        await self._close(session)

    async def aclose(self) -> None:
        """Let go of every open session (the operator stopping): holders and leases released."""
        for session in list(self._open.values()):
            async with session.lock:
                await self._close(session)

    def open_sessions(self) -> int:
        return len(self._open)

    async def _session(self, ref: SandboxRef) -> OpenSession:
        async with self._opening:
            found = self._open.get(ref)
            if found is not None and not found.closed:
                return found
            run = await self._run(ref)
            try:
                lease = await self.executor.claim(run.run_id)
            except LeaseHeld as held:
                raise CallRefused(409, "another operator replica is answering a call of this Sandbox",
                                  where=ref.where, do=f"retry with the same operationId in {held.remaining:.0f}s",
                                  retry=True) from held
            try:
                rt = await self.executor.open_runtime(run, lease)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.store.release(lease)
                raise
            session = self._open[ref] = OpenSession(lease, rt)
            session.start(self._renew, max(self.executor.lease_ttl / 3, 0.05), self.hold, self._close)
            return session

    async def _renew(self, lease: Lease) -> Lease:
        return await self.store.renew(lease, self.executor.lease_ttl)

    async def _close(self, session: OpenSession) -> None:
        for ref, found in list(self._open.items()):
            if found is session:
                del self._open[ref]
        await session.shut(self.store.release)

    async def _execute(self, ref: SandboxRef, rt: RunRuntime, handle: SandboxHandle, provider: SandboxProvider,
                       call: ToolCall) -> Answered:
        self._handles[rt.run_id] = handle
        try:
            session = SandboxSession(rt, SESSION, provider, attach=ref.name, owner=f"{ref.namespace}/{ref.uid}",
                                     next_index=_index_of(rt, call.operation_id))
            await session.__aenter__()  # journals the attach once (``calls/provision``)
            # The live sandbox is the Sandbox's, read from its record when the session took it: it may have been
            # recovered or resumed since the session's first call recorded one.
            session.state.handle = handle
            # One record per call, committed before the call is answered (SandboxSession.call's journal_start).
            result = await session.call(call, journal_start=False)
            await rt.write()
        except NonDeterminismError as exc:
            raise _reused(ref, call.operation_id) from exc
        finally:
            self._handles.pop(rt.run_id, None)
        return Answered(result, replayed=False)

    async def _run(self, ref: SandboxRef) -> RunRecord:
        run_id = calls_run_id(ref.uid)
        found = await self.store.get_run(run_id)
        if found is not None:
            return found
        record = RunRecord(run_id=run_id, workflow=SESSION_WORKFLOW, status=RunStatus.RUNNING,
                           input={"sandbox": ref.name}, labels={"durable-sandbox.dev/sandbox": ref.name})
        owner = {"owner": OwnerRef(name=ref.name, uid=ref.uid, kind="Sandbox")} if self.owned else {}
        created, _ = await self.store.create_run(record, **owner)
        return created


def _completed(ref: SandboxRef, rows: list[Any], call: ToolCall) -> Answered | None:
    op_id = journal.call_id(SESSION, call.operation_id)
    latest = None
    first = None
    for row in rows:
        if row.op_id == op_id:
            first = first or row
            latest = row
    if latest is None or first is None:
        return None
    digest = value_digest([call.type, call.args])
    if first.name != call.type or (first.input_digest is not None and first.input_digest != digest):
        raise _reused(ref, call.operation_id)
    if latest.status != "completed":
        return None
    r = latest.result
    return Answered(ToolResult(exit_code=int(r["exitCode"]), stdout=r.get("stdout", ""), stderr=r.get("stderr", ""),
                               stdout_size=r.get("stdoutBytes"), stderr_size=r.get("stderrBytes")), replayed=True)


def _index_of(rt: RunRuntime, operation_id: str) -> int:
    """The call's place in the session: the one its ``started`` record took (a retried call interrupted by a
    crash), else after every call journaled so far."""
    started = rt.lookup(journal.call_id(SESSION, operation_id))
    index = journal.call_index(started) if started is not None else None
    if index is not None:
        return index
    indexes = [i for r in rt.rows
               if r.op_id.startswith(SESSION + "/") and r.kind == journal.CALL and (i := journal.call_index(r)) is not None]
    return max(indexes, default=-1) + 1


def _reused(ref: SandboxRef, operation_id: str) -> CallRefused:
    return CallRefused(409, f"operationId {operation_id!r} was already used for another call of this Sandbox",
                       where=f"{ref.where}, operationId", do="give every new call a new operationId; send the same "
                       "request (same kind and arguments) only to retry a call")
