"""Shared parts of the session service's unit tests: a fake authorizer (tokens -> users -> rights), a fake gate
over a LocalProvider sandbox with a holder a test can give to a Workflow, and the service over a SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import uvicorn

from durable_sandbox.kube.sandbox.checkpoints import session_snapshots
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider, SandboxSpec
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.hold import HoldSettings, LeftToAnotherReplica
from durable_sandbox.sessions.http import create_app
from durable_sandbox.sessions.journal import SandboxRef, SessionJournal
from durable_sandbox.sessions.models import Limits
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.stores.sqlite import SqliteStore

NAMESPACE = "demo"


@dataclass
class FakeAuth:
    """token -> user; user -> the (namespace, Sandbox) pairs it may call."""

    users: dict[str, str] = field(default_factory=lambda: {"good-token": "alice", "other-token": "bob"})
    rights: dict[str, set[tuple[str, str]]] = field(default_factory=lambda: {"alice": {(NAMESPACE, "box"), (NAMESPACE, "missing")}})
    checked: int = 0
    owners: set[str] = field(default_factory=lambda: {"alice"})  # who may update (rewind) the Sandbox

    async def check(self, token: str | None, namespace: str, name: str) -> str:
        self.checked += 1
        if not token:
            raise CallRefused(401, "no bearer token in the request", where="header", do="send one")
        user = self.users.get(token)
        if user is None:
            raise CallRefused(401, "the bearer token was not accepted", where="header", do="send a current one")
        if (namespace, name) not in self.rights.get(user, set()):
            raise CallRefused(403, f"{user} may not call this Sandbox", where=f"Sandbox {namespace}/{name}", do="bind")
        return user

    async def check_workflow(self, token: str | None, namespace: str, name: str, verb: str) -> str:
        return await self.check(token, namespace, f"workflow:{name}")

    async def check_update(self, token: str | None, namespace: str, name: str) -> str:
        user = await self.check(token, namespace, name)
        if user not in self.owners:
            raise CallRefused(403, f"{user} may not rewind this Sandbox's session", where=f"Sandbox {namespace}/{name}",
                              do="bind")
        return user


@dataclass
class FakeGate:
    """The Sandbox "box" (uid-1) and, standing in for its controller, the replacement of a lost sandbox: restored
    from the newest snapshot of its session calls (``store``) or provisioned fresh, its lineage recorded."""

    provider: LocalProvider
    handle: SandboxHandle
    held_by: str | None = None  # a Workflow holding the Sandbox
    taken: int = 0  # session calls that took the holder
    released: int = 0  # times the holder was let go
    left: int = 0  # times a hold whose lease was lost let go without releasing the holder
    in_live: asyncio.Event = field(default_factory=asyncio.Event)  # set while a call is inside live()
    let_go: asyncio.Event | None = None  # when set to an Event, live() waits on it (a call held in flight)
    snapshot_every: int = 0  # spec.snapshotEveryNCalls
    store: Any = None  # the namespace's journal store (the controller reads the session's snapshots from it)
    lineage_of: dict[str, str] = field(default_factory=dict)
    replacements: list[tuple[str, str | None]] = field(default_factory=list)  # (lost id, snapshot restored)
    shown: list[tuple[int, list[str]]] = field(default_factory=list)  # rewinds shown in status.lastRewind

    async def find(self, namespace: str, name: str) -> SandboxRef:
        if name != "box":
            raise CallRefused(404, "no such Sandbox", where=f"Sandbox {namespace}/{name}", do="create it")
        return SandboxRef(namespace, name, "uid-1", snapshot_every=self.snapshot_every)

    async def rewound(self, ref: SandboxRef, to_call: int, rewound: list[str]) -> None:
        self.shown.append((to_call, rewound))

    async def replaced(self, ref: SandboxRef, lost: str) -> SandboxHandle:
        if self.handle.id == lost:
            snapshots = await session_snapshots(SimpleNamespace(store_for=lambda _ns: self.store), ref.namespace,  # type: ignore[arg-type]
                                                ref.uid) if self.store is not None else []
            source = snapshots[-1].snapshot_id if snapshots else None
            spec = SandboxSpec(owner="demo/uid-1")
            self.handle = (await self.provider.restore(source, spec, lease_seconds=600) if source
                           else await self.provider.provision(spec, lease_seconds=600))
            self.lineage_of[self.handle.id] = source or ""
            self.replacements.append((lost, source))
        return self.handle

    async def lineage(self, ref: SandboxRef) -> Mapping[str, str]:
        return dict(self.lineage_of)

    @contextlib.asynccontextmanager
    async def live(self, ref: SandboxRef) -> AsyncIterator[tuple[SandboxHandle, SandboxProvider]]:
        if self.held_by is not None:
            raise CallRefused(409, f"the Sandbox is held by Workflow {self.held_by!r}", where=ref.where, do="wait")
        self.taken += 1
        self.in_live.set()
        try:
            if self.let_go is not None:
                await self.let_go.wait()
            yield self.handle, self.provider
        except LeftToAnotherReplica:
            self.left += 1  # not released: another replica holds the session now
            raise
        else:
            self.released += 1


async def local_gate(home: Path, provider: LocalProvider | None = None) -> FakeGate:
    provider = provider or LocalProvider(home)
    handle = await provider.provision(SandboxSpec(owner="demo/uid-1"), lease_seconds=600)
    return FakeGate(provider, handle, lineage_of={handle.id: ""})


def service(store: SqliteStore, gate: FakeGate, auth: FakeAuth | None = None, *, worker: str = "w1",
            limits: Limits | None = None, hold: HoldSettings | None = None,
            extensions: Sequence[object] = ()) -> SessionService:
    return service_and_journal(store, gate, auth, worker=worker, limits=limits, hold=hold, extensions=extensions)[0]


def service_and_journal(store: SqliteStore, gate: FakeGate, auth: FakeAuth | None = None, *, worker: str = "w1",
                        limits: Limits | None = None, hold: HoldSettings | None = None,
                        lease_ttl: float = 10.0, extensions: Sequence[object] = ()) -> tuple[SessionService, SessionJournal]:
    journal = SessionJournal(store, worker_id=worker, lease_ttl=lease_ttl, owned=False, hold=hold,
                             extensions=extensions)
    return SessionService(auth or FakeAuth(), gate, lambda _ns: journal, limits), journal


def effects(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait (yielding to the loop) until ``condition`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serving_call_api(tmp_path: Path) -> AsyncIterator[tuple[int, FakeGate]]:
    """The call API served by uvicorn on a free local port, over a local sandbox: (port, gate)."""
    gate = await local_gate(tmp_path / "home")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(service(SqliteStore(tmp_path / "runs.db"), gate)),
                                           lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await until(lambda: server.started)
    try:
        yield int(sock.getsockname()[1]), gate
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def serving_mcp(tmp_path: Path) -> AsyncIterator[tuple[str, FakeGate, SqliteStore]]:
    """The call API with MCP over HTTP, served on a free local port: (the Sandbox box's MCP URL, gate, store)."""
    from durable_sandbox.sessions.mcp_http import McpEndpoint

    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    svc = service(store, gate)
    mcp = McpEndpoint(svc)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(svc, mcp=mcp), lifespan="off", log_level="warning"))
    async with mcp.lifespan():
        task = asyncio.create_task(server.serve(sockets=[sock]))
        await until(lambda: server.started)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1/namespaces/demo/sandboxes/box/mcp", gate, store
        finally:
            server.should_exit = True
            await task
