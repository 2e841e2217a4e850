"""One commit per sandbox call: call i's completion rides on call i+1's start (``RunRuntime.defer_completion``).

What must hold (durability first): when the provider executes call i+1, call i's completion is already in
the store; the run's final commit carries the last completion; a completion whose ride does not come
(workflow code busy between calls) is committed on its own, so a crash then loses no completed call.
The crash side (``after:<call>`` reached once the completion has landed, no committed call run twice) is
tests/unit/test_crash_safety.py, tests/unit/test_interruptions.py and tests/e2e/test_operator_failover.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox import Context, workflow
from durable_sandbox.engine.records import Commit
from durable_sandbox.providers.contract import SandboxHandle, ToolCall
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore
from tests.unit.sandbox_session_support import WORKER, Hooked

CALLS = 12


class CountingStore(SqliteStore):
    """The real SQLite store, counting the commits the engine makes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commits = 0

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        self.commits += 1
        await super().commit(run_id, fence, commit)


@pytest.fixture
def local(home: Path) -> Any:
    provider = Hooked(LocalProvider(home))
    yield provider
    assert provider.inner.leftovers() == [], "the run left sandboxes, snapshots or leases behind"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    s = CountingStore(tmp_path / "runs.db")
    yield s
    await s.close()


@dataclass(frozen=True)
class Gate:
    """An extension value (engine/extensions.py): what the busy workflow waits on between its calls."""

    opened: asyncio.Event


def engine_with(store: CountingStore, local: Hooked, *extensions: object) -> durable_sandbox.Engine:
    return durable_sandbox.Engine(store, providers={"local": local}, worker_id=WORKER, lease_ttl=30.0,
                                  extensions=extensions)


async def test_a_call_is_one_commit_and_its_completion_lands_before_the_next_call_runs(
    store: CountingStore, local: Hooked, tmp_path: Path
) -> None:
    reader = SqliteStore(tmp_path / "runs.db")  # another connection: what a crash would leave behind
    seen: list[tuple[str, set[str]]] = []

    async def before_execute(handle: SandboxHandle, call: ToolCall) -> None:
        rows = await reader.load_journal("one-commit")
        seen.append((call.operation_id, {r.op_id for r in rows if r.kind == "sandbox.call" and r.status == "completed"}))

    local.before_execute = before_execute
    engine = engine_with(store, local)
    try:
        calls = [{"type": "write_file", "path": f"f{i}.txt", "contents": "x"} for i in range(CALLS)]
        state = await engine.run("sandbox-agent", {"toolCalls": calls}, run_id="one-commit")
        assert state.status == "succeeded", state.error
        ids = [r["operationId"] for r in state.result["toolResults"]]
    finally:
        await engine.aclose()
        await reader.close()
    # Durability: every earlier call's completion was committed before the provider ran the next call.
    assert [op for op, _ in seen] == ids
    for i, (_, done) in enumerate(seen):
        assert done == {f"sandbox/{op}" for op in ids[:i]}, f"call {i} ran before earlier completions were committed"
    rows = await store.load_journal("one-commit")
    calls_rows = [(r.op_id, r.status) for r in rows if r.kind == "sandbox.call"]
    assert calls_rows == [(f"sandbox/{op}", s) for op in ids for s in ("started", "completed")]
    # One commit per call, plus a fixed few per run (running, provision, finalize, the final status).
    fixed = store.commits - CALLS
    assert 0 < fixed <= 8, f"{store.commits} commits for {CALLS} calls"


@workflow(name="test-commit-per-call-busy-between")
async def busy_between(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    """A call, then workflow code that takes a while before the next journaled operation."""
    gate = ctx.operations.extensions.get(Gate)
    assert gate is not None, "the test gives the engine a Gate"
    async with ctx.sandbox("sandbox", provider="local") as sbx:
        await sbx.write_file("a.txt", "a")
        await gate.opened.wait()  # until the test has seen the completion committed on its own
        await sbx.write_file("b.txt", "b")
    return {}


async def test_a_completion_whose_ride_does_not_come_is_committed_on_its_own(
    store: CountingStore, local: Hooked, tmp_path: Path
) -> None:
    gate = asyncio.Event()
    engine = engine_with(store, local, Gate(gate))
    reader = SqliteStore(tmp_path / "runs.db")
    try:
        task = asyncio.create_task(engine.run("test-commit-per-call-busy-between", {}, run_id="busy"))
        deadline = time.monotonic() + 60
        while True:
            rows = await reader.load_journal("busy")
            if any(r.kind == "sandbox.call" and r.status == "completed" for r in rows):
                break
            assert not task.done(), task.result()
            assert time.monotonic() < deadline, f"the first call's completion was never committed: {rows}"
            await asyncio.sleep(0.05)
        assert [r.kind for r in rows if r.kind == "sandbox.call"] == ["sandbox.call"] * 2  # started, completed
        gate.set()
        state = await task
        assert state.status == "succeeded", state.error
    finally:
        gate.set()
        await engine.aclose()
        await reader.close()
