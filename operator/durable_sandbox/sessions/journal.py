"""The Sandbox's own call journal: calls made to a Sandbox resource directly, journaled like a Workflow's.

A Sandbox's session calls live in one run of its namespace's store (``dsbx.<uid>.calls``, owned by the Sandbox, so
it goes with it), under the session ``calls``: the same records, sealing and machinery as a Workflow's sandbox calls
(``sandboxes/session.py`` attached to the Sandbox's live sandbox, as ``spec.sandboxRef`` does). Each call:

1. runs under the run's lease (the fence: a replica that lost it can never write) and the journal as read when the
   lease was taken; both are kept while calls keep coming and let go after an idle gap (``hold.py``), so a call
   answered by another replica, or before a restart, is known here (no other replica writes while this one holds);
2. a call whose ``operationId`` the journal has completed is answered from the journal and never runs again (the
   same arguments required: an id reused for another call is refused);
3. otherwise the live sandbox is brought to hold every earlier completed call (``rebuild.py``: after a loss, the
   controller's replacement gets the calls after its snapshot replayed), its ``started`` record is committed
   before the provider runs it, and its ``completed`` record (the result, capped as the journal keeps it) is
   committed before it is answered: two journal writes per call. Every ``spec.snapshotEveryNCalls`` completed
   calls the sandbox is snapshot (the superseded snapshot deleted once the new one is recorded). A call whose
   ``started`` record has no completion (the operator died while it ran) runs again, as the same attempt, when it
   is retried, but never in the sandbox it may have run in: that one's state is unknown, so it is replaced and
   rebuilt first. Why keep the ``started`` record although it doubles the writes: it is what tells an
   interrupted call from one never run, and without it the workspace could hold an interrupted call twice.
   A call that cannot change the workspace (``read_file``, ``list``) has nothing to tell apart: only its
   completion is journaled (one write), a rebuild never replays it, and interrupted it runs again when retried.
4. a sandbox lost under a call (or its rebuild) is waited for: the controller re-creates it from the newest
   snapshot, the calls after it are replayed, and the call runs there; the caller sees only the latency. Under a
   hold the hold's live sandbox becomes the replacement.

Why the lease is let go after an idle gap rather than kept for the session: a session may sit idle for hours
between calls; holding a run's lease that long would keep every other replica from answering it after a failover
until the lease ran out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from durable_sandbox.engine.errors import LeaseHeld, NonDeterminismError
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import Lease, RunRecord, RunStatus
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.serialization import value_digest
from durable_sandbox.engine.traced import under_caller
from durable_sandbox.kube.sandbox.view import CALLS_SESSION, calls_run_id
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.providers.contract import (
    Capability,
    SandboxHandle,
    SandboxProvider,
    ToolCall,
    ToolResult,
)
from durable_sandbox.providers.streaming import OutputSink, streaming_to
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.session import (
    AttachedSandboxLost,
    SandboxServices,
    SandboxSession,
    SessionState,
)
from durable_sandbox.sandboxes.traced import traced_provider
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.fork_restore import own_fork_point
from durable_sandbox.sessions.fork_seed import SourceRef, seed_fork, seeded
from durable_sandbox.sessions.hold import HoldSettings, OpenSession
from durable_sandbox.sessions.rebuild import HandedBack, SandboxAccess, SandboxUnknown, rebuild
from durable_sandbox.sessions.rewind import Rewound, commit_rewind, rebuilt_calls
from durable_sandbox.sessions.snapshots import Snapshot, snapshot_taken, take_snapshot
from durable_sandbox.tracing import Tracing

__all__ = ["SESSION", "SESSION_WORKFLOW", "Rewound", "SandboxRef", "SessionJournal", "calls_run_id"]

T = TypeVar("T")

log = logging.getLogger("durable_sandbox.sessions")

SESSION = CALLS_SESSION  # the session id of a Sandbox's own calls in its journal (op ids ``calls/<operationId>``)
SESSION_WORKFLOW = "sandbox-session"  # the run's workflow name: never executed, it names what the run is
MAX_REPLACEMENTS = 3  # sandboxes lost (or found unknown) under one call before it is refused (503: retry)


@dataclass(frozen=True)
class SandboxRef:
    """A Sandbox resource as the operator recorded it: its name AND uid (a re-created Sandbox is another one)."""

    namespace: str
    name: str
    uid: str
    # spec.snapshotEveryNCalls when the call was sent (not part of the identity: one turn per Sandbox whatever it is)
    snapshot_every: int = field(default=0, compare=False)
    source: SourceRef | None = field(default=None, compare=False)  # spec.from: a fork of another's session

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
                 hold: HoldSettings | None = None, extensions: Iterable[object] = ()) -> None:
        self.store = store
        self.owned = owned  # the run is owned by the Sandbox (its store takes an owner: the operator's stores do)
        self.hold = hold or HoldSettings()
        self._handles: dict[str, SandboxHandle] = {}  # run id -> the live sandbox taken for the call in flight
        self._open: dict[SandboxRef, OpenSession] = {}  # the Sandboxes whose session is open in this process
        # One opening at a time per Sandbox (two calls of one Sandbox never open two sessions), and the Sandboxes'
        # openings side by side: each is a lease claim and a journal read, and under one lock for all a slow API
        # server queued every Sandbox behind the others' openings until their holds' idle gaps ran out, so that
        # the holds kept being let go and opened again (benchmarks/session_calls.py --node, 20 sessions).
        self._opening: dict[SandboxRef, _Opening] = {}
        given = list(extensions)
        # Tracing, unless given, as OpenTelemetry's environment configures it (docs/operations.md, "Traces").
        traced = Tracing.from_env() if not any(isinstance(e, Tracing) for e in given) else None
        self.executor = RunExecutor(store, worker_id=worker_id, lease_ttl=lease_ttl,
                                    extensions=[SandboxServices(attached=self._attached), *given, *([traced] if traced else [])])

    async def _attached(self, run_id: str, _name: str) -> SandboxHandle:
        return self._handles[run_id]

    async def call(self, ref: SandboxRef, gate: SandboxAccess, call: ToolCall, *,
                   on_replay: str = journal.ON_REPLAY_RERUN, traceparent: str | None = None,
                   sink: OutputSink | None = None, read_only: bool = False) -> Answered:
        """Run ``call`` in the Sandbox's live sandbox, journaled (see the module's docstring). ``gate.live`` takes
        the Sandbox (its holder) and gives its sandbox and provider: entered under the journal's lease, so two
        replicas never both hold it for calls, and kept with the session while calls keep coming (``hold.py``).
        ``traceparent``: the caller's trace, the parent of the request's span. ``sink``: given the call's output
        while it runs, when the provider streams (``Capability.OUTPUT_STREAMING``); a call answered from the
        journal gives it nothing (its caller has the journaled output at once). ``read_only``: the call cannot change the
        workspace (``SandboxSession.call``): its completion is its only record."""

        async def answer(session: OpenSession) -> Answered:
            done = _completed(ref, session.rt, session.derived.view(session.rt.rows), call)
            if done is not None:
                return done
            await session.live(lambda: gate.live(ref))
            return await self._rebuilt(ref, session, gate,
                                       lambda rt: _index_of(rt, session.derived.view(rt.rows), call.operation_id),
                                       lambda rt, handle, provider: self._traced(ref, session, handle, provider,
                                                                                 call, on_replay, traceparent,
                                                                                 sink, read_only),
                                       what=f"call {call.operation_id}")

        return await self._held(ref, gate, answer)

    async def rewind(self, ref: SandboxRef, gate: SandboxAccess, to_call: int) -> Rewound:
        """Rewind the Sandbox's session to after its call ``to_call`` (``rewind.py``), under the session's lease
        and turn like a call; answers once the live sandbox holds exactly the calls kept."""
        async def run(session: OpenSession) -> Rewound:
            await session.live(lambda: gate.live(ref))
            assert session.provider is not None
            rewound = await commit_rewind(session.rt, ref.where, session.provider, to_call)
            replayed: list[str] = []

            async def ready(rt: RunRuntime, handle: SandboxHandle, _provider: SandboxProvider) -> SandboxHandle:
                replayed.extend(rebuilt_calls(rt, handle.id))
                return handle

            handle = await self._rebuilt(ref, session, gate, lambda _rt: to_call, ready, what="the rewind")
            return Rewound(to_call, rewound, handle.id, tuple(replayed))

        return await self._held(ref, gate, run)

    async def snapshot(self, ref: SandboxRef, gate: SandboxAccess, operation_id: str) -> Snapshot:
        """A snapshot of the live sandbox now, once it holds every completed session call: recorded in the call
        journal like the ones every ``spec.snapshotEveryNCalls`` calls (the one it supersedes deleted after), so a
        loss restores it. The same ``operation_id`` again answers with the snapshot it took (``replayed``); a
        snapshot a later rewind deleted (it held rewound calls) is never answered nor restored (``snapshots.py``)."""

        async def take(session: OpenSession) -> Snapshot:
            done = snapshot_taken(session.rt.rows, operation_id, where=ref.where)
            if done is not None:
                return done
            await session.live(lambda: gate.live(ref))
            assert session.provider is not None
            if not session.provider.capabilities().supports(Capability.SNAPSHOT):
                raise CallRefused(409, f"provider {session.provider.name} cannot snapshot", where=ref.where,
                                  do="use a provider with snapshots (docs/providers.md lists them)")
            def count(rt: RunRuntime) -> int:
                return _index_of(rt, session.derived.view(rt.rows), None)

            return await self._rebuilt(ref, session, gate, count, lambda rt, handle, provider:
                                       take_snapshot(rt, handle, provider, operation_id, self._handles,
                                                     sandbox=ref.name, owner=f"{ref.namespace}/{ref.uid}",
                                                     snapshot_every=ref.snapshot_every, count=count(rt)),
                                       what=f"snapshot {operation_id}")

        return await self._held(ref, gate, take)

    async def _held(self, ref: SandboxRef, gate: SandboxAccess, run: Callable[[OpenSession], Awaitable[T]]) -> T:
        """``run`` under the Sandbox's open session (its lease fresh, one at a time; a fork's journal seeded
        first): the session kept after it while calls keep coming, let go after a failure (the next call reads
        the journal again)."""
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
                    if ref.source is not None and not seeded(session.rt):
                        await seed_fork(self.store, ref, ref.source, session.rt, gate)
                    return await run(session)
                except CallRefused:
                    if session.handle is None:  # refused before or while taking the Sandbox: hold nothing
                        await self._close(session)
                    raise
                except BaseException:
                    await self._close(session)  # the next call starts afresh (the journal read again)
                    raise
                finally:
                    session.in_flight = None
                    session.last_used = time.monotonic()
                    if self.hold.idle_seconds <= 0:
                        await self._close(session)

    async def _rebuilt(self, ref: SandboxRef, session: OpenSession, gate: SandboxAccess,
                       before: Callable[[RunRuntime], int],
                       then: Callable[[RunRuntime, SandboxHandle, SandboxProvider], Awaitable[T]], *, what: str) -> T:
        """``then`` in the hold's live sandbox once it holds every completed call before index ``before(rt)``; a
        sandbox lost, unknown or stale is replaced (the controller's replacement becomes the hold's) and rebuilt
        first."""
        handle, provider = session.handle, session.provider
        assert handle is not None and provider is not None
        if ref.source is not None:  # a fork: its source's snapshot made its own first (fork_restore.py)
            await own_fork_point(session.rt, provider, sandbox=ref.name, owner=f"{ref.namespace}/{ref.uid}",
                                 where=ref.where)
        if ref.snapshot_every and not provider.capabilities().supports(Capability.SNAPSHOT):
            raise CallRefused(409, f"spec.snapshotEveryNCalls is {ref.snapshot_every}, but provider "
                              f"{provider.name} cannot snapshot", where=f"{ref.where}, spec.snapshotEveryNCalls",
                              do="set spec.snapshotEveryNCalls to 0, or use a provider with snapshots")
        # A call started before and never answered (this one retried, or another one its caller gave up on): the
        # operator stopped while it ran, in the sandbox it may have changed (if that one is still live, its
        # state is unknown), so no call runs there before it is rebuilt. (A rewound call is no longer one.)
        interrupted = session.derived.interrupted(session.rt.rows)
        for _ in range(MAX_REPLACEMENTS):
            try:
                rows = session.rt.rows
                await rebuild(session.rt, handle, provider, lambda: gate.lineage(ref), interrupted=interrupted,
                              before=before(session.rt), where=ref.where,
                              known=(session.derived.holdings(rows), session.derived.view(rows)))
                return await then(session.rt, handle, provider)
            except HandedBack as back:  # a fork's fresh sandbox: its replacement is restored from its snapshot
                lost = back.sandbox_id
                log.info("%s: %s waits for sandbox %s's replacement, restored from the fork's snapshot", ref.where,
                         what, lost)
            except SandboxUnknown as unknown:
                lost = unknown.sandbox_id
                log.warning("%s: sandbox %s is unknown or stale; %s waits for its replacement", ref.where, lost, what)
            except AttachedSandboxLost as gone:
                lost = gone.sandbox_id or handle.id
                log.warning("%s: sandbox %s is lost; %s waits for its replacement", ref.where, lost, what)
            interrupted = False  # a replacement is newer than the interruption
            handle = session.handle = await gate.replaced(ref, lost)  # the hold keeps the replacement
            session.rt = await self.executor.open_runtime(session.run, session.lease)  # the journal as it is now
        raise CallRefused(503, f"the Sandbox's sandbox was lost {MAX_REPLACEMENTS} times under {what}",
                          where=ref.where, do="retry with the same operationId; `kubectl describe dsbx` says "
                          "why its sandboxes do not last")

    async def _traced(self, ref: SandboxRef, session: OpenSession, handle: SandboxHandle, provider: SandboxProvider,
                      call: ToolCall, on_replay: str, traceparent: str | None, sink: OutputSink | None,
                      read_only: bool = False) -> Answered:
        """:meth:`_execute` in the request's span, the child of the caller's ``traceparent`` header (the call's
        own span inside)."""
        return await under_caller(session.rt, traceparent, f"sandbox.session_call {call.type}",
                                  {"durable_sandbox.sandbox": ref.where, "durable_sandbox.operation.id":
                                   call.operation_id},
                                  lambda: self._execute(ref, session, handle, provider, call, on_replay, sink,
                                                                    read_only))

    async def aclose(self) -> None:
        """Let go of every open session (the operator stopping): holders and leases released."""
        for session in list(self._open.values()):
            async with session.lock:
                await self._close(session)

    def open_sessions(self) -> int:
        return len(self._open)

    async def _session(self, ref: SandboxRef) -> OpenSession:
        opening = self._opening.setdefault(ref, _Opening())
        opening.users += 1
        try:
            async with opening.lock:
                return await self._open_session(ref)
        finally:
            opening.users -= 1
            if opening.users == 0 and self._opening.get(ref) is opening:
                del self._opening[ref]

    async def _open_session(self, ref: SandboxRef) -> OpenSession:
        """The Sandbox's open session, or a new one (its lease claimed, its journal read): under its opening lock."""
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
        session = self._open[ref] = OpenSession(lease, rt, run)
        session.start(self._renew, self.executor.lease_ttl, self.hold, self._close)
        return session

    async def _renew(self, lease: Lease) -> Lease:
        return await self.store.renew(lease, self.executor.lease_ttl)

    async def _close(self, session: OpenSession) -> None:
        for ref, found in list(self._open.items()):
            if found is session:
                del self._open[ref]
        await session.shut(self.store.release)

    async def _execute(self, ref: SandboxRef, held: OpenSession, handle: SandboxHandle, provider: SandboxProvider,
                       call: ToolCall, on_replay: str, sink: OutputSink | None, read_only: bool = False) -> Answered:
        rt = held.rt
        self._handles[rt.run_id] = handle
        try:
            rows = rt.known_rows()  # the committed rows (the session's own: nothing of it waits to be committed)
            known = held.derived.state(rows) if rows is rt.rows else None
            session = SandboxSession(rt, SESSION, traced_provider(rt, SESSION, provider), attach=ref.name,
                                     owner=f"{ref.namespace}/{ref.uid}",
                                     next_index=_index_of(rt, held.derived.view(rt.rows), call.operation_id),
                                     snapshot_every=ref.snapshot_every, state=known)
            await session.__aenter__()  # journals the attach once (``calls/provision``)
            # The live sandbox is the Sandbox's, read from its record when the session took it: it may have been
            # recovered or resumed since the session's first call recorded one.
            session.state.handle = handle
            streams = sink is not None and provider.capabilities().supports(Capability.OUTPUT_STREAMING)
            with streaming_to(sink if streams else None):  # the output while it runs (only this call's)
                result = await session.call(call, on_replay=on_replay, read_only=read_only)  # started committed first
            await rt.write()  # the completion, committed before the call is answered
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


@dataclass(eq=False)
class _Opening:
    """A Sandbox's opening lock and how many calls wait on or hold it (dropped when none does)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def _completed(ref: SandboxRef, rt: RunRuntime, state: SessionState, call: ToolCall) -> Answered | None:
    """The call's journaled answer, if it completed (``state``: the session's, as of ``rt``'s rows)."""
    op_id = journal.call_id(SESSION, call.operation_id)
    if op_id in state.rewound:
        raise CallRefused(409, f"operationId {call.operation_id!r} names a call that was rewound (its result is no "
                          "longer the session's)", where=f"{ref.where}, operationId",
                          do="send the call under a new operationId: it runs after the calls the rewind kept")
    latest, first = rt.latest.get(op_id), rt.first.get(op_id)
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


def _index_of(rt: RunRuntime, state: SessionState, operation_id: str | None) -> int:
    """The call's place in the session: the one its ``started`` record took (a retried call interrupted by a
    crash), else after every call of the session so far (also for ``None``: a snapshot of them all; after a
    rewind to ``N``, the calls kept and those since). ``state``: the session's, as of ``rt``'s rows."""
    if operation_id is None:
        return state.next_index
    op_id = journal.call_id(SESSION, operation_id)
    started = rt.lookup(op_id)
    index = journal.call_index(started) if started is not None and op_id not in state.rewound else None
    return index if index is not None else state.next_index


def _reused(ref: SandboxRef, operation_id: str) -> CallRefused:
    return CallRefused(409, f"operationId {operation_id!r} was already used for another call of this Sandbox",
                       where=f"{ref.where}, operationId", do="give every new call a new operationId; send the same "
                       "request (same kind and arguments) only to retry a call")
