"""A user cancel stops a run's workflow task once, whoever notices it first: the process asked to cancel it
(``cancel_here``: the operator on a spec change) or the lease keeper, which polls the store. Both used to
cancel the task; the second cancel landed in the cleanup the first one had started, and the run ended
``cancelled`` with its sandbox live and its snapshot kept (the chaos soak left an E2B sandbox and snapshot so).

Which reader's answer lands first is the test's choice, not the scheduler's: the store holds ``get_run``
calls until the test releases them, one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_sandbox import Context, Engine, workflow
from durable_sandbox.engine import RunStatus
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.stores import SqliteStore

entered: asyncio.Event | None = None


@workflow(name="cancel-once-sandboxed")
async def sandboxed(ctx: Context) -> str:
    async def hold() -> str:
        assert entered is not None
        entered.set()
        await asyncio.Event().wait()  # until cancelled
        return "never"

    async with ctx.sandbox("ws", provider="local", snapshot_every=1) as sbx:
        await sbx.shell("echo one > one.txt")
        return await ctx.step("hold", hold)


class HeldReads:
    """The store, with ``get_run`` held while ``holding``; ``held`` lists each held call's task and its release."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.holding = False
        self.held: list[tuple[asyncio.Task[Any] | None, asyncio.Event]] = []

    async def get_run(self, run_id: str) -> RunRecord | None:
        if self.holding:
            release = asyncio.Event()
            self.held.append((asyncio.current_task(), release))
            await release.wait()
        return await self.inner.get_run(run_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.01)


async def test_a_cancel_noticed_twice_stops_the_run_once_and_its_cleanup_runs(
    store: SqliteStore, durable_home: Path
) -> None:
    global entered
    entered = asyncio.Event()
    held = HeldReads(store)
    engine = Engine(held, worker_id="w", lease_ttl=0.3)  # the keeper polls the store every 0.1 s
    try:
        running = asyncio.create_task(engine.run(sandboxed, run_id="r"))
        await asyncio.wait_for(entered.wait(), 30)
        wf = engine.executor._tasks["r"]

        # Another process asks for the cancel; this one is told to cancel its execution (cancel_here) and the
        # keeper will notice it too. The session's cleanup first asks the store why the run was cancelled.
        held.holding = True
        await store.update_run("r", {"cancel_requested": "no longer needed"})
        cancelling = asyncio.create_task(engine.executor.cancel_here("r", "no longer needed"))
        await until(lambda: any(t is wf for t, _ in held.held) and any(t is not wf for t, _ in held.held),
                    "the cleanup (in the run's task) and the keeper to read the run")

        # The keeper's answer lands first; it has acted on it once it reads the run again.
        keeper_reads = [r for t, r in held.held if t is not wf]
        keeper_reads[0].set()
        await until(lambda: sum(t is not wf for t, _ in held.held) > len(keeper_reads),
                    "the keeper's next read of the run")
        held.holding = False
        for _, release in held.held:
            release.set()

        state = await asyncio.wait_for(running, 30)
        await asyncio.wait_for(cancelling, 30)
    finally:
        held.holding = False
        for _, release in held.held:
            release.set()
        await engine.aclose()

    assert state.status == RunStatus.CANCELLED
    rows = await store.load_journal("r")
    finalized = [r for r in rows if r.op_id == "ws/finalize"]
    assert finalized and finalized[0].meta == {"finalized": True, "retained": None, "succeeded": False}, \
        [(r.op_id, r.status) for r in rows]
    local = durable_home / "local"
    left = [str(p.relative_to(local)) for sub in ("workspaces", "snapshots") if (local / sub).is_dir()
            for p in (local / sub).iterdir() if not p.name.startswith(".")]
    assert left == [], f"sandbox or snapshot left by the cancelled run: {left}"
