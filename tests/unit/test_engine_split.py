"""The engine's two sides: the client talks to runs through the store only; the executor runs them
under leases, never twice at once in one process, and leaves a run it cannot import to others when
told to (the operator) instead of failing it (dsb)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durable_sandbox.engine import (
    Context,
    Engine,
    NotRunnableHere,
    RunClient,
    RunExecutor,
    RunStatus,
    WorkflowNotFound,
    workflow,
)
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.engine.sources import poll_store
from durable_sandbox.stores import SqliteStore

started = 0
gate: asyncio.Event | None = None
entered: asyncio.Event | None = None


@workflow(name="split-gated")
async def gated(ctx: Context, n: int) -> int:
    async def body() -> int:
        global started
        started += 1
        assert gate is not None and entered is not None
        entered.set()
        await gate.wait()
        return n * 2

    return await ctx.step("double", body)


async def test_client_creates_and_signals_without_executing(store: SqliteStore) -> None:
    client = RunClient(store)
    run = await client.create(gated, 3, run_id="c-1")
    assert run.status == RunStatus.PENDING
    assert await client.signal("c-1", "approve", {"ok": True}) is True
    assert await client.signal("c-1", "approve", {"ok": True}) is False  # idempotent for the same value
    before = await client.request_cancel("c-1", "no longer needed")
    assert before.cancel_requested is None
    state = await client.inspect("c-1")
    assert state.status == "pending" and state.operations == []
    assert (await store.get_run("c-1")).cancel_requested == "no longer needed"  # type: ignore[union-attr]


async def test_duplicate_drive_in_one_process_is_skipped_not_executed_twice(store: SqliteStore) -> None:
    global started, gate, entered
    started, gate, entered = 0, asyncio.Event(), asyncio.Event()
    client = RunClient(store)
    executor = RunExecutor(store, worker_id="w", lease_ttl=10.0)
    await client.create(gated, 4, run_id="dup")
    first = asyncio.create_task(executor.drive("dup", if_busy="skip"))
    await entered.wait()
    assert executor.is_executing("dup")
    fence_before = (await store.get_run("dup")).fence  # type: ignore[union-attr]
    # A duplicate event from a run source: refused at once, and the lease (fence) is left alone.
    assert await executor.drive("dup", if_busy="skip") is None
    assert (await store.get_run("dup")).fence == fence_before  # type: ignore[union-attr]
    gate.set()
    state = await first
    assert state is not None and state.status == "succeeded" and state.result == 8
    assert started == 1
    assert not executor.is_executing("dup")


async def test_claimed_duplicate_is_released_without_executing(store: SqliteStore) -> None:
    global started, gate, entered
    started, gate, entered = 0, asyncio.Event(), asyncio.Event()
    executor = RunExecutor(store, worker_id="w", lease_ttl=10.0)
    await RunClient(store).create(gated, 5, run_id="dup2")
    first = asyncio.create_task(executor.drive("dup2"))
    await entered.wait()
    # A source that claimed the run anyway (same owner) gets its claim given back, and the run goes on.
    lease = await store.claim("dup2", "w", 10.0)
    await executor.run_claimed(lease)
    assert started == 1
    gate.set()
    # The stray claim advanced the fence past the first execution's, so that one stops without writing
    # (fencing); the run stays runnable and the next drive finishes it.
    await first
    state = await executor.drive("dup2")
    assert state is not None and state.status == "succeeded" and state.result == 10


async def test_unimportable_workflow_fails_in_dsb_but_is_left_for_others_by_the_operator(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    try:
        for run_id in ("fail-here", "leave-it"):
            await store.create_run(RunRecord(run_id=run_id, workflow="nowhere.flows:missing", workflow_ref="nowhere.flows:missing"))
        dsb = RunExecutor(store, worker_id="dsb")
        with pytest.raises(WorkflowNotFound):
            await dsb.drive("fail-here")
        failed = await store.get_run("fail-here")
        assert failed is not None and failed.status == RunStatus.FAILED and "nowhere" in (failed.error.message if failed.error else "")

        op = RunExecutor(store, worker_id="operator", unresolvable="leave")
        with pytest.raises(NotRunnableHere) as info:
            await op.drive("leave-it")
        assert "leave-it" in str(info.value) and "nowhere" in str(info.value)
        left = await store.get_run("leave-it")
        assert left is not None and left.status == RunStatus.PENDING and left.error is None
        assert left.lease_owner is None  # released for a replica that has the code
    finally:
        await store.close()


async def test_store_poller_runs_what_engine_created(store: SqliteStore) -> None:
    global started, gate, entered
    started, gate, entered = 0, asyncio.Event(), asyncio.Event()
    gate.set()
    engine = Engine(store, worker_id="e", lease_ttl=10.0)
    await engine.create(gated, 6, run_id="polled")
    await poll_store(engine.executor, idle_exit=True, poll_interval=0.01)
    assert (await engine.inspect("polled")).result == 12
