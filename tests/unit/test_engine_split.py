"""The engine's two sides: the client talks to runs through the store only; the executor runs them
under leases, never twice at once in one process, and leaves a run it cannot import to others when
told to (the operator) instead of failing it (dsb)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

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


async def test_unimportable_workflow_is_left_as_it_is_unless_the_executor_is_told_to_fail_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    try:
        for run_id in ("leave-it", "fail-here"):
            await store.create_run(RunRecord(run_id=run_id, workflow="nowhere.flows:missing", workflow_ref="nowhere.flows:missing"))
        default = RunExecutor(store, worker_id="dsb")  # dsb and the operator alike: code missing here is no failure
        with pytest.raises(NotRunnableHere) as info:
            await default.drive("leave-it")
        assert "leave-it" in str(info.value) and "import module 'nowhere.flows'" in str(info.value)
        assert info.value.module == "nowhere.flows"
        left = await store.get_run("leave-it")
        assert left is not None and left.status == RunStatus.PENDING and left.error is None
        assert left.lease_owner is None  # released for a process that has the code

        failing = RunExecutor(store, worker_id="embedder", unresolvable="fail")
        with pytest.raises(WorkflowNotFound):
            await failing.drive("fail-here")
        failed = await store.get_run("fail-here")
        assert failed is not None and failed.status == RunStatus.FAILED and "nowhere" in (failed.error.message if failed.error else "")
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


effects: list[str] = []
handover_gate: asyncio.Event | None = None
in_b: asyncio.Event | None = None


@workflow(name="split-handover")
async def handover_flow(ctx: Context) -> list[str]:
    async def effect(name: str) -> str:
        effects.append(name)
        if name == "b":
            assert handover_gate is not None and in_b is not None
            in_b.set()
            await handover_gate.wait()
        return name

    out = [await ctx.step("a", effect, "a"), await ctx.step("b", effect, "b")]
    async with ctx.sandbox("box", provider="local") as sbx:
        out.append((await sbx.shell("echo one")).stdout.strip())
        out.append(await ctx.step("c", effect, "c"))
        out.append((await sbx.shell("echo two")).stdout.strip())
    return out


async def test_hand_over_stops_at_the_next_boundary_and_another_worker_continues(store: SqliteStore) -> None:
    global handover_gate, in_b
    effects.clear()
    handover_gate, in_b = asyncio.Event(), asyncio.Event()
    import durable_sandbox

    first = durable_sandbox.Engine(store, worker_id="replica-1", lease_ttl=10.0)
    second = durable_sandbox.Engine(store, worker_id="replica-2", lease_ttl=10.0)
    try:
        await first.create(handover_flow, run_id="ho")
        task = asyncio.create_task(first.executor.drive("ho"))
        await in_b.wait()
        assert first.executor.hand_over("ho", "replica shutting down")
        assert not second.executor.hand_over("ho", "not here")
        handover_gate.set()  # the step in flight completes and is committed; nothing new starts
        state = await task
        assert state is not None and state.status == "pending"
        assert effects == ["a", "b"]
        run = await store.get_run("ho")
        assert run is not None and run.lease_owner is None  # released at once, not left to expire
        done = await second.resume("ho")
        assert done.status == "succeeded" and done.result == ["a", "b", "one", "c", "two"]
        assert effects == ["a", "b", "c"]  # no completed step ran again
        kinds = [r.kind for r in await store.load_journal("ho") if r.status == "completed"]
        assert kinds.count("sandbox.provision") == 1
    finally:
        await first.aclose()
        await second.aclose()


async def test_hand_over_keeps_a_live_sandbox_for_the_next_worker(store: SqliteStore) -> None:
    global handover_gate, in_b
    effects.clear()
    handover_gate, in_b = asyncio.Event(), asyncio.Event()
    import durable_sandbox

    first = durable_sandbox.Engine(store, worker_id="replica-1", lease_ttl=10.0)
    second = durable_sandbox.Engine(store, worker_id="replica-2", lease_ttl=10.0)
    try:
        await first.create(handover_flow, run_id="ho2")
        handover_gate.set()
        # Hand over as soon as the sandbox's first call completed: stop before step c.
        original = first.executor.store.commit

        async def commit_then_hand_over(run_id: str, fence: int, commit: Any) -> None:
            await original(run_id, fence, commit)
            if any(r.kind == "sandbox.call" and r.status == "completed" for r in commit.records):
                first.executor.hand_over(run_id, "suspend requested")

        first.executor.store = _Proxy(store, commit=commit_then_hand_over)  # type: ignore[assignment]
        state = await first.executor.drive("ho2")
        assert state is not None and state.status == "pending"
        rows = await store.load_journal("ho2")
        assert not any(r.kind == "sandbox.destroy" for r in rows)  # not finalized, not hibernated
        done = await second.resume("ho2")
        assert done.status == "succeeded" and done.result == ["a", "b", "one", "c", "two"]
        provisions = [r for r in await store.load_journal("ho2") if r.kind == "sandbox.provision" and r.status == "completed"]
        assert len(provisions) == 1  # the second worker re-attached to the same sandbox
    finally:
        await first.aclose()
        await second.aclose()


class _Proxy:
    """The store with one method replaced (observing commits the way the operator does)."""

    def __init__(self, inner: Any, **overrides: Any) -> None:
        self._inner = inner
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
