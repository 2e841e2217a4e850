"""Child workflows on SQLite (the cases: tests/unit/child_workflow_cases.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine import Engine, workflow
from durable_sandbox.engine.children import child_run_id
from durable_sandbox.engine.store import Store
from durable_sandbox.stores import SqliteStore
from tests.unit.child_workflow_cases import ChildWorkflowCases


class TestChildWorkflowsSqlite(ChildWorkflowCases):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        self.location = str(tmp_path / "runs.db")
        s = SqliteStore(self.location)
        yield s
        await s.close()


async def test_closing_the_engine_leaves_a_child_executing_here_resumable(tmp_path: Path) -> None:
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def held() -> str:
        entered.set()
        await gate.wait()
        return "done"

    @workflow(name="compose-held-child")
    async def child(ctx: Any) -> str:
        return await ctx.step("held", held)

    @workflow(name="compose-held-parent")
    async def parent(ctx: Any) -> str:
        return await ctx.child_workflow(child, id="c")

    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id="w1", lease_ttl=10.0)
    await engine.start(parent, run_id="held")
    await asyncio.wait_for(entered.wait(), 60)
    await engine.aclose()
    child_id = child_run_id("held", "c")
    for run_id in (child_id, "held"):  # interrupted, not lost: runnable by any worker
        run = await store.get_run(run_id)
        assert run is not None and run.status.value == "pending", (run_id, run)
    gate.set()
    again = Engine(store, worker_id="w1", lease_ttl=10.0)
    state = await again.resume("held")
    assert state.status == "succeeded" and state.result == "done"
    await again.aclose()
    await store.close()
