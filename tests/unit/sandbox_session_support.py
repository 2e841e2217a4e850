"""Helpers for the sandbox-session tests (tests/unit/test_sandbox_sessions.py, tests/contract/test_e2b_sessions.py).

* :class:`Hooked` wraps any provider: it logs every lifecycle call, observes how many snapshots exist at the
  moment one is taken or deleted (through the provider's own listing), and runs test hooks around
  ``execute`` (kill the sandbox from outside, SIGKILL the worker, signal that a call is in flight).
* A few code-first workflows, registered by importing this module, so that a child process (which crashes)
  and the test process (which resumes) resolve the same definitions.
* ``python -m tests.unit.sandbox_session_support <db> <run id> <workflow> <input json>`` drives one run in a
  child process; ``DSB_TEST_CRASH_AFTER_EXECUTE=<operation id>[@<n>]`` makes it SIGKILL itself right after
  the provider executed that call (the n-th time) (the effect happened, its completion is not journaled), and
  ``DSB_TEST_CRASH_AFTER_PROVISION=1`` right after the provider made the sandbox (before it is journaled);
  ``DSB_TEST_CRASH_IN_SNAPSHOT_WRITE=1`` half-way through writing a snapshot's temp file and
  ``DSB_TEST_CRASH_IN_TRASH=1`` while a destroyed workspace's trash is being deleted (what a real kill
  leaves on disk); ``DURABLE_SANDBOX_FAULT`` works as everywhere (``durable_sandbox.engine.faults``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
import durable_sandbox.workflows.sandbox_agent
from durable_sandbox import Context, workflow
from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.providers.contract import (
    Capability,
    ProviderCapabilities,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
    ToolResult,
)
from durable_sandbox.providers.local import LocalProvider

REPO = Path(__file__).resolve().parents[2]
WORKER = "test-worker"  # the child and the test process share it, so a resume may take the dead child's lease

# The calls of the provider-backed session tests (e2b, kubernetes): a nonzero exit that mutates the workspace
# among them, so a replay after a loss must give it again.
SESSION_CALLS = [
    {"type": "write_file", "path": "a.txt", "contents": "hello\n"},
    {"type": "shell", "command": "cat a.txt; echo more >> a.txt"},
    {"type": "shell", "command": "echo broken >> a.txt; ls nope"},
    {"type": "read_file", "path": "a.txt"},
    {"type": "shell", "command": "wc -l < a.txt"},
    {"type": "shell", "command": "echo done >> a.txt; cat a.txt"},
]

ExecuteHook = Callable[[SandboxHandle, ToolCall], Awaitable[None]]
ResultHook = Callable[[SandboxHandle, ToolCall, ToolResult], Awaitable[None]]


@pytest.fixture
def local(home: Path) -> Iterator[Hooked]:
    """The run's local provider (wrapped to observe it). At teardown its directories must hold nothing: every
    sandbox, snapshot and lease a run made is gone (hidden temp and trash entries count too)."""
    provider = Hooked(LocalProvider(home))
    yield provider
    assert provider.inner.leftovers() == [], "the run left sandboxes, snapshots or leases behind"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


def derived_id(run_id: str, index: int, session: str = "sandbox") -> str:
    """DESIGN 6: ``"dsv1_" + sha256(run_id \\0 session \\0 index)`` (hex, first 40 digits)."""
    return "dsv1_" + hashlib.sha256(f"{run_id}\0{session}\0{index}".encode()).hexdigest()[:40]


class Hooked(SandboxProvider):
    """A provider that delegates to ``inner`` and lets the tests watch and interfere."""

    def __init__(self, inner: SandboxProvider, *, name: str | None = None,
                 without: frozenset[Capability] = frozenset(),
                 list_snapshots: Callable[[], Sequence[str]] | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name  # type: ignore[misc]
        self._without = without
        self._list = list_snapshots or inner.list_snapshots  # type: ignore[attr-defined]
        self.log: list[tuple[str, str]] = []
        self.population: list[int] = []  # snapshots that exist, seen at every snapshot taken and every delete
        self.before_execute: ExecuteHook | None = None
        self.after_execute: ResultHook | None = None
        self.before_snapshot: Callable[[SandboxHandle, str], Awaitable[None]] | None = None
        self.executes = 0

    def calls(self, method: str) -> list[str]:
        return [detail for m, detail in self.log if m == method]

    def capabilities(self) -> ProviderCapabilities:
        caps = self.inner.capabilities()
        if self._without:
            caps = caps.model_copy(update={"supported": caps.supported - self._without})
        return caps

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        handle = await self.inner.provision(spec, lease_seconds=lease_seconds)
        self.log.append(("provision", handle.id))
        return handle

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        if self.before_execute is not None:
            await self.before_execute(handle, call)
        self.executes += 1
        self.log.append(("execute", call.operation_id))
        result = await self.inner.execute(handle, call)
        if self.after_execute is not None:
            await self.after_execute(handle, call, result)
        return result

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        if self.before_snapshot is not None:
            await self.before_snapshot(handle, operation_id)
        snapshot_id = await self.inner.snapshot(handle, operation_id=operation_id)
        self.population.append(len(self._list()))
        self.log.append(("snapshot", snapshot_id))
        return snapshot_id

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        handle = await self.inner.restore(snapshot_id, spec, lease_seconds=lease_seconds)
        self.log.append(("restore", handle.id))
        return handle

    async def copy_snapshot(self, snapshot_id: str, *, operation_id: str) -> str:
        copy_id = await self.inner.copy_snapshot(snapshot_id, operation_id=operation_id)
        self.log.append(("copy_snapshot", copy_id))
        return copy_id

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.population.append(len(self._list()))
        self.log.append(("delete_snapshot", snapshot_id))
        await self.inner.delete_snapshot(snapshot_id)

    async def suspend(self, handle: SandboxHandle) -> None:
        await self.inner.suspend(handle)

    async def resume(self, handle: SandboxHandle) -> SandboxHandle:
        return await self.inner.resume(handle)

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        return await self.inner.renew_lease(handle, seconds)

    async def destroy(self, handle: SandboxHandle) -> None:
        self.log.append(("destroy", handle.id))
        await self.inner.destroy(handle)

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        return await self.inner.list_sandboxes(owner)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        if Capability.LOSS_INJECTION in self._without:
            await super().inject_loss(handle)
        self.log.append(("inject_loss", handle.id))
        await self.inner.inject_loss(handle)

    async def aclose(self) -> None:
        await self.inner.aclose()


def engine_for(db: Path, providers: dict[str, SandboxProvider], **kwargs: Any) -> durable_sandbox.Engine:
    from durable_sandbox.stores import SqliteStore

    return durable_sandbox.Engine(SqliteStore(db), providers=providers, worker_id=WORKER, lease_ttl=30.0, **kwargs)


def journal_index(rows: Sequence[OperationRecord], op_id: str, status: str) -> int:
    """Position of the first record of ``op_id`` with ``status`` (the journal is append-only, in order)."""
    for i, r in enumerate(rows):
        if r.op_id == op_id and r.status == status:
            return i
    raise AssertionError(f"no {status} record for {op_id} in the journal: {[(r.op_id, r.status) for r in rows]}")


# ------------------------------------------------------------------------------------------ workflows


@workflow(name="test-sessions-step-between")
async def step_between(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    """Calls, then an ordinary step (a fault point), then more calls in the same sandbox."""
    async with ctx.sandbox("sandbox", provider="local") as sbx:
        await sbx.shell("echo 0 >> trace.txt")
        await sbx.shell("echo 1 >> trace.txt")
        await ctx.step("between", _noop)
        await sbx.shell("echo 2 >> trace.txt")
        trace = await sbx.read_file("trace.txt")
    return {"trace": trace.stdout, **sbx.result()}


def _noop() -> str:
    return "ok"


@workflow(name="test-sessions-approval")
async def approval(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    """A sandbox held across a callback (hibernation, cancel of a waiting run)."""
    options = {k: spec[k] for k in ("hibernate_after", "snapshot_every") if k in spec}
    async with ctx.sandbox("sandbox", provider=spec.get("provider", "local"), **options) as sbx:
        await sbx.write_file("notes/a.txt", "alpha\n")
        await sbx.shell("echo beta > b.txt && mkdir -p d && echo gamma > d/c.txt && chmod +x b.txt")
        verdict = await ctx.callback("approve", {"question": "go on?"})
        out = await sbx.shell("cat notes/a.txt b.txt d/c.txt && test -x b.txt && echo executable")
    return {"verdict": verdict, "out": out.stdout, **sbx.result()}


@workflow(name="test-sessions-fails-inside")
async def fails_inside(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    """Snapshots (retained on success), then the workflow fails inside the sandbox block."""
    async with ctx.sandbox("sandbox", provider=spec.get("provider", "local"), snapshot_every=1,
                           retain_latest_snapshot=True) as sbx:
        await sbx.write_file("a.txt", "a\n")
        await sbx.shell("echo b > b.txt")
        raise RuntimeError("the agent gave up")
    return sbx.result()  # pragma: no cover


@workflow(name="test-sessions-duplicate-ids")
async def duplicate_ids(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("sandbox", provider="local", operation_ids=["fetch", None, "fetch"]) as sbx:
        await sbx.shell("echo should-not-run")
    return sbx.result()


@workflow(name="test-sessions-long-call")
async def long_call(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("sandbox", provider="local", snapshot_every=1) as sbx:
        await sbx.write_file("a.txt", "a\n")
        await sbx.shell("sleep 60")
    return sbx.result()


# ------------------------------------------------------------------------------------------ child process


def run_child(db: Path, run_id: str, workflow_name: str, spec: Any, *, env: dict[str, str],
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Drive one run in a child process (which is expected to kill itself at a fault point)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.unit.sandbox_session_support", str(db), run_id, workflow_name, json.dumps(spec)],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
    )


async def _child(db: Path, run_id: str, workflow_name: str, spec: Any) -> None:
    provider = Hooked(LocalProvider())  # $DURABLE_SANDBOX_HOME, inherited from the test
    crash_after, _, nth = os.environ.get("DSB_TEST_CRASH_AFTER_EXECUTE", "").partition("@")
    seen = 0

    async def maybe_crash(handle: SandboxHandle, call: ToolCall, result: ToolResult) -> None:
        nonlocal seen
        if call.operation_id == crash_after:
            seen += 1
            if seen == int(nth or 1):
                os.kill(os.getpid(), signal.SIGKILL)

    provider.after_execute = maybe_crash
    from durable_sandbox.providers.local import archives, layout

    if os.environ.get("DSB_TEST_CRASH_IN_SNAPSHOT_WRITE"):
        def write_half_then_die(workspace: Path, destination: Path, *_: Any) -> None:  # and its budget
            destination.write_bytes(b"half a tar")
            os.kill(os.getpid(), signal.SIGKILL)

        archives.write_tar = write_half_then_die  # type: ignore[assignment]
    if os.environ.get("DSB_TEST_CRASH_IN_TRASH"):
        real_rmtree = layout.rmtree

        def die_in_trash(path: Path) -> None:
            if path.name.startswith(".trash-"):
                os.kill(os.getpid(), signal.SIGKILL)
            real_rmtree(path)

        layout.rmtree = die_in_trash  # type: ignore[assignment]
    if os.environ.get("DSB_TEST_CRASH_AFTER_PROVISION"):
        inner_provision = provider.inner.provision

        async def provision_then_crash(spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
            await inner_provision(spec, lease_seconds=lease_seconds)
            os.kill(os.getpid(), signal.SIGKILL)
            raise AssertionError("unreachable")

        provider.inner.provision = provision_then_crash  # type: ignore[method-assign]
    engine = engine_for(db, {"local": provider})
    state = await engine.run(workflow_name, spec, run_id=run_id)
    await engine.aclose()
    print(json.dumps({"status": state.status, "error": state.error}))


if __name__ == "__main__":
    asyncio.run(_child(Path(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
