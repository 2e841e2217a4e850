"""The call service: who may call a Sandbox, how much, and in what order; the journal does the rest.

Order of a request: the caller is authenticated and authorized first (nothing is read or run for a refused one),
held to its calls per second (``rates.py``), then the Sandbox is found by name (its uid from the API server), admitted under the per-Sandbox bound (calls in
flight or waiting, in this process), and takes its turn: one call at a time per Sandbox, as an agent makes them.
The journal (``journal.py``) answers a retried call from its record, or runs a new one in the live sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from durable_sandbox.providers.streaming import OutputSink
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.journal import SandboxRef, SessionJournal
from durable_sandbox.sessions.models import (
    CallAnswer,
    CallRequest,
    Limits,
    RewindAnswer,
    RewindRequest,
    ShellRequest,
    SnapshotAnswer,
    SnapshotRequest,
)
from durable_sandbox.sessions.rates import CallerRates
from durable_sandbox.sessions.rebuild import SandboxAccess

__all__ = ["Authorizer", "SandboxGate", "SessionService"]

log = logging.getLogger("durable_sandbox.sessions")


class Authorizer(Protocol):
    """Who is calling, and whether they may call Sandbox ``name`` (``create sandboxes/calls`` in ``namespace``).
    Returns the caller's name for the log; raises :class:`CallRefused` (401 or 403). Never logs the token."""

    async def check(self, token: str | None, namespace: str, name: str) -> str: ...

    async def check_update(self, token: str | None, namespace: str, name: str) -> str:
        """As :meth:`check`, for what changes the Sandbox's history (a rewind): ``update sandboxes``."""
        ...

    async def check_workflow(self, token: str | None, namespace: str, name: str, verb: str) -> str:
        """As :meth:`check`, for Workflow ``name``: ``verb workflows`` (``get``: may read its run)."""
        ...


class SandboxGate(SandboxAccess, Protocol):
    """The Sandbox resources: found by name, and their live sandbox taken by a session (the holder rule; kept while
    calls keep coming, hold.py), waited for when it is replaced after a loss."""

    async def find(self, namespace: str, name: str) -> SandboxRef: ...

    async def rewound(self, ref: SandboxRef, to_call: int, rewound: list[str]) -> None:
        """Show a rewind done (``status.lastRewind``): for people only, the journal is what counts."""
        ...


class SessionService:
    def __init__(self, auth: Authorizer, gate: SandboxGate, journal_for: Callable[[str], SessionJournal],
                 limits: Limits | None = None) -> None:
        self.auth = auth
        self.gate = gate
        self.journal_for = journal_for
        self.limits = limits or Limits()
        self.rates = CallerRates(self.limits.max_calls_per_second)
        self._admitted: dict[SandboxRef, int] = {}  # calls in flight or waiting, per Sandbox
        self._turns: dict[SandboxRef, asyncio.Lock] = {}
        self.detached: set[asyncio.Task[Any]] = set()  # streamed calls, kept running when their caller goes away

    async def call(self, token: str | None, namespace: str, name: str, request: CallRequest, *,
                   traceparent: str | None = None, sink: OutputSink | None = None) -> CallAnswer:
        """The call's answer (run now, or from the journal); ``sink`` gets its output while it runs, when the
        Sandbox's provider streams it."""
        caller, ref = await self._caller(token, namespace, name)
        timeout = request.timeout if isinstance(request, ShellRequest) else None
        if timeout is not None and timeout > self.limits.max_timeout:
            raise CallRefused(400, f"timeout {timeout:g}s is over this operator's limit of {self.limits.max_timeout:g}s", where=f"{ref.where}, timeout",
                              do="ask for a shorter timeout, or split the work into several calls")
        async with self._admission(ref), self._turn(ref):
            answered = await self.journal_for(namespace).call(ref, self.gate, request.tool_call(),
                                                              on_replay=request.onReplay, traceparent=traceparent,
                                                              sink=sink, read_only=request.read_only)
        log.info("%s: call %s (%s) by %s %s", ref.where, request.operationId, request.tool_call().type, caller,
                 "answered from the journal" if answered.replayed else f"exited {answered.result.exit_code}")
        return CallAnswer.of(request.operationId, answered.result, replayed=answered.replayed)

    async def snapshot(self, token: str | None, namespace: str, name: str, request: SnapshotRequest) -> SnapshotAnswer:
        """A snapshot of the Sandbox now, in its turn among the calls (``sessions/snapshots.py``)."""
        caller, ref = await self._caller(token, namespace, name)
        async with self._admission(ref), self._turn(ref):
            taken = await self.journal_for(namespace).snapshot(ref, self.gate, request.operationId)
        log.info("%s: snapshot %s by %s %s", ref.where, request.operationId, caller,
                 "answered from the journal" if taken.replayed else f"took {taken.snapshot_id}")
        return SnapshotAnswer(operationId=request.operationId, snapshotId=taken.snapshot_id, calls=taken.calls,
                              replayed=taken.replayed)

    async def _caller(self, token: str | None, namespace: str, name: str) -> tuple[str, SandboxRef]:
        """Who calls (authenticated and authorized first), within its rate, and the Sandbox it names."""
        caller = self.within_rate(await self.auth.check(token, namespace, name), f"Sandbox {namespace}/{name}")
        return caller, await self._found(token, namespace, name)

    def within_rate(self, caller: str, where: str) -> str:
        """``caller``, if it is within its calls per second (one bucket per caller for every request of this call
        API: calls, snapshots, rewinds, Workflow queries and updates); CallRefused 429 otherwise."""
        wait = self.rates.take(caller)
        if wait is not None:
            raise CallRefused(429, f"{caller} made more than {self.limits.max_calls_per_second:g} calls per second",
                              where=where, retry_after=wait,
                              do=f"slow down: retry the same request in {wait:.2f}s (Retry-After); the "
                              "operator's --session-max-calls-per-second sets the rate")
        return caller

    async def rewind(self, token: str | None, namespace: str, name: str, request: RewindRequest) -> RewindAnswer:
        """Rewind the Sandbox's session to after its call ``request.toCall`` (sessions/rewind.py): allowed to who
        may update the Sandbox, and taking its turn like a call (never while one runs)."""
        caller = self.within_rate(await self.auth.check_update(token, namespace, name), f"Sandbox {namespace}/{name}")
        ref = await self._found(token, namespace, name)
        async with self._admission(ref), self._turn(ref):
            done = await self.journal_for(namespace).rewind(ref, self.gate, request.toCall)
        if done.rewound:
            try:
                await self.gate.rewound(ref, done.to_call, list(done.rewound))
            except Exception as exc:  # shown only: the rewind is committed in the journal either way
                log.warning("%s: the rewind could not be shown in status.lastRewind (%s)", ref.where, exc)
        log.info("%s: rewound to call %d by %s: %d calls rewound (%s), sandbox %s", ref.where, done.to_call, caller,
                 len(done.rewound), ", ".join(done.rewound) or "none", done.sandbox_id)
        return RewindAnswer(toCall=done.to_call, rewound=list(done.rewound), sandboxId=done.sandbox_id,
                            replayed=list(done.replayed))

    async def _found(self, token: str | None, namespace: str, name: str) -> SandboxRef:
        """The Sandbox; a fork (spec.from) is called only by who may call its source Sandbox (or get its source
        Workflow) too: its journal starts with the source's calls (their arguments and results), which are the
        source's to show (docs/forks.md)."""
        ref = await self.gate.find(namespace, name)
        if ref.source is not None and ref.source.sandbox is not None:
            await self.auth.check(token, namespace, ref.source.sandbox)
        if ref.source is not None and ref.source.workflow is not None:  # may read the Workflow (its run's calls)
            await self.auth.check_workflow(token, namespace, ref.source.workflow, "get")
        return ref

    def admitted(self, ref: SandboxRef) -> int:
        """Calls of ``ref`` in flight or waiting their turn in this process."""
        return self._admitted.get(ref, 0)

    @contextlib.asynccontextmanager
    async def _admission(self, ref: SandboxRef) -> AsyncIterator[None]:
        count = self._admitted.get(ref, 0)
        if count >= self.limits.max_concurrent_calls:
            raise CallRefused(429, f"{count} calls of this Sandbox are already in flight or waiting their turn "
                              f"(the limit is {self.limits.max_concurrent_calls})", where=ref.where,
                              do="wait for an answer before sending the next call, then retry this one with the "
                              "same operationId")
        self._admitted[ref] = count + 1
        try:
            yield
        finally:
            left = self._admitted[ref] - 1
            if left:
                self._admitted[ref] = left
            else:
                del self._admitted[ref]

    @contextlib.asynccontextmanager
    async def _turn(self, ref: SandboxRef) -> AsyncIterator[None]:
        lock = self._turns.setdefault(ref, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and ref not in self._admitted:
                self._turns.pop(ref, None)
