"""A user cancel stops a run's workflow task once, whoever notices it first: the process asked to cancel it
(``cancel_here``: the operator on a spec change) or the lease keeper, which polls the store. Both used to
cancel the task; the second cancel landed in the cleanup the first one had started, and the run ended
``cancelled`` with its sandbox live and its snapshot kept (the chaos soak left an E2B sandbox and snapshot so).

Which reader's answer lands first is the test's choice, not the scheduler's: the store holds ``get_run``
calls until the test releases them, one by one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from durable_sandbox import Context, Engine, workflow
from durable_sandbox.engine import RunStatus
from durable_sandbox.engine.errors import StoreUnavailable
from durable_sandbox.engine.records import Lease, RunRecord
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


@contextlib.asynccontextmanager
async def holding_run(store: Any) -> AsyncIterator[tuple[Engine, asyncio.Task[Any]]]:
    """An engine on ``store`` executing run "r" of ``sandboxed``, once its step holds; the engine is closed after."""
    global entered
    entered = asyncio.Event()
    engine = Engine(store, worker_id="w", lease_ttl=0.3)  # the keeper renews and polls the store every 0.1 s
    try:
        running = asyncio.create_task(engine.run(sandboxed, run_id="r"))
        await asyncio.wait_for(entered.wait(), 30)
        yield engine, running
    finally:
        await engine.aclose()


async def test_a_cancel_noticed_twice_stops_the_run_once_and_its_cleanup_runs(
    store: SqliteStore, home: Path
) -> None:
    held = HeldReads(store)
    async with holding_run(held) as (engine, running):
        try:
            wf = engine.executor.here.tasks["r"]

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
        finally:  # never leave a read held: closing the engine waits for them
            held.holding = False
            for _, release in held.held:
                release.set()

    assert state.status == RunStatus.CANCELLED
    rows = await store.load_journal("r")
    finalized = [r for r in rows if r.op_id == "ws/finalize"]
    assert finalized and finalized[0].meta == {"finalized": True, "retained": None, "succeeded": False}, \
        [(r.op_id, r.status) for r in rows]
    local = home / "local"
    left = [str(p.relative_to(local)) for sub in ("workspaces", "snapshots") if (local / sub).is_dir()
            for p in (local / sub).iterdir() if not p.name.startswith(".")]
    assert left == [], f"sandbox or snapshot left by the cancelled run: {left}"

# The lease keeper outlives a failed read of the run. It renews the lease, then reads the run (is a cancel
# requested?); a read that failed (the store away for a moment: ``StoreUnavailable``, an API server restart)
# ended the keeper, so the lease lapsed while the run went on executing here, and a replica taking the run over
# would execute it alongside. Only a failed renewal means the lease is lost.


class FailingReads:
    """The store, whose next ``failures`` reads of a run fail as an unreachable API server's would."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.failures = 0
        self.renewals = 0

    async def get_run(self, run_id: str) -> RunRecord | None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreUnavailable("the API server could not be reached", run_id)
        return await self.inner.get_run(run_id)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        self.renewals += 1
        return await self.inner.renew(lease, ttl)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_the_keeper_renews_on_after_a_failed_read_and_still_sees_a_cancel(
    store: SqliteStore, home: Path
) -> None:
    flaky = FailingReads(store)
    async with holding_run(flaky) as (_, running):
        flaky.failures = 3  # only the keeper reads the run while the step holds
        await until(lambda: flaky.failures == 0, "the keeper's three failed reads")
        after_failures = flaky.renewals
        await until(lambda: flaky.renewals >= after_failures + 3, "the keeper to go on renewing the lease", 10)
        await store.update_run("r", {"cancel_requested": "no longer needed"})
        state = await asyncio.wait_for(running, 30)
        assert state.status == "cancelled", state
