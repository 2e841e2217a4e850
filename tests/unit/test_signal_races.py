"""A signal that arrives while the run is executing (before it reaches the callback) is not lost:
the run takes it when it gets there instead of going to sleep on it."""

from __future__ import annotations

from pathlib import Path

import durable_sandbox as ds
from durable_sandbox.stores import SqliteStore

ENGINES: dict[str, ds.Engine] = {}


async def approve_from_elsewhere(run_id: str) -> str:
    # Stands for another process signalling while this run executes: a second engine on the same store.
    await ENGINES["other"].signal(run_id, "approve", "yes")
    return "asked"


@ds.workflow(name="tests.signal_race")
async def ask_then_wait(ctx: ds.Context) -> str:
    await ctx.step("ask", approve_from_elsewhere, ctx.run_id)
    return await ctx.callback("approve")


async def test_a_signal_sent_during_the_execution_is_taken_at_the_callback(tmp_path: Path) -> None:
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"))
    ENGINES["other"] = ds.Engine(SqliteStore(tmp_path / "runs.db"))
    try:
        state = await engine.run(ask_then_wait, run_id="race")
        assert state.status == "succeeded", "the run must not wait on a callback whose signal is already stored"
        assert state.result == "yes"
    finally:
        await ENGINES.pop("other").aclose()
        await engine.aclose()
