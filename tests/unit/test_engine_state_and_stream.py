"""Thread state (`ctx.state`, shared by runs with the same thread id, persisted at step boundaries) and
progress streaming (`Engine.stream`, from this process and from another one on the same store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import durable_sandbox as ds
from durable_sandbox.engine.errors import RunNotFound
from durable_sandbox.stores import SqliteStore

ROOT = Path(__file__).resolve().parents[2]
seen_counts: list[int] = []


def remember(n: int) -> int:
    seen_counts.append(n)
    return n


@ds.workflow(name="tests.state.counter")
async def counter(ctx: ds.Context, label: str) -> dict[str, object]:
    ctx.state.setdefault("labels", [])
    ctx.state["labels"].append(label)
    ctx.state["count"] = ctx.state.get("count", 0) + 1
    await ctx.step("record", remember, ctx.state["count"])
    return {"count": ctx.state["count"], "labels": list(ctx.state["labels"])}


async def test_thread_state_is_shared_by_runs_of_a_thread_and_persisted(tmp_path: Path) -> None:
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"))
    first = await engine.run(counter, "a", run_id="t1", thread_id="conversation-1")
    second = await engine.run(counter, "b", run_id="t2", thread_id="conversation-1")
    other = await engine.run(counter, "c", run_id="t3", thread_id="conversation-2")
    assert first.result == {"count": 1, "labels": ["a"]}
    assert second.result == {"count": 2, "labels": ["a", "b"]}, "the second run of the thread sees the first's state"
    assert other.result == {"count": 1, "labels": ["c"]}, "threads are independent"
    await engine.aclose()

    # A fresh process (a new engine on the same file) sees the persisted state.
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"))
    third = await engine.run(counter, "d", run_id="t4", thread_id="conversation-1")
    assert third.result == {"count": 3, "labels": ["a", "b", "d"]}
    assert third.thread_id == "conversation-1"
    await engine.aclose()


@ds.workflow(name="tests.stream.progress")
async def reporting(ctx: ds.Context, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.step(f"part-{i}", remember, i)
        ctx.progress(f"part {i + 1} of {n}", percent=100.0 * (i + 1) / n, part=i)
    await ctx.callback("ok")
    return total


async def test_stream_yields_operations_progress_and_run_events_in_order(tmp_path: Path) -> None:
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"))
    state = await engine.run(reporting, 3, run_id="s1")
    assert state.status == "waiting"
    events = [e async for e in engine.stream("s1")]
    types = [e["type"] for e in events]
    assert types[0] == "run.started"
    assert [e["opId"] for e in events if e["type"] == "step.completed"] == ["part-0", "part-1", "part-2"]
    progress = [e for e in events if e["type"] == "progress"]
    assert [p["percent"] for p in progress] == pytest.approx([100 / 3, 200 / 3, 100.0])
    assert [p["part"] for p in progress] == [0, 1, 2]
    assert types.index("step.completed") < types.index("progress"), "progress follows the step it reports"
    assert "callback.waiting" in types and types[-1] == "run.waiting"

    # Resuming replays the steps: no progress is reported again for work done before.
    await engine.signal("s1", "ok", True)
    state = await engine.resume("s1")
    assert state.status == "succeeded"
    events = [e async for e in engine.stream("s1")]
    assert len([e for e in events if e["type"] == "progress"]) == 3
    assert events[-1]["type"] == "run.succeeded"
    with pytest.raises(RunNotFound):
        [e async for e in engine.stream("nope")]
    await engine.aclose()


async def test_stream_works_from_another_process_on_the_same_store(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    engine = ds.Engine(SqliteStore(db))
    await engine.run(reporting, 2, run_id="s2")
    await engine.aclose()
    code = (
        "import asyncio, json, sys\n"
        "import durable_sandbox as ds\n"
        "from durable_sandbox.stores import SqliteStore\n"
        "async def main():\n"
        "    eng = ds.Engine(SqliteStore(sys.argv[1]))\n"
        "    print(json.dumps([e async for e in eng.stream('s2')]))\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run(  # noqa: ASYNC221 - a separate process reading the same store is the point
        [sys.executable, "-c", code, str(db)], cwd=ROOT, env=dict(os.environ), capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    events = json.loads(proc.stdout)
    assert [e["message"] for e in events if e["type"] == "progress"] == ["part 1 of 2", "part 2 of 2"]
    assert events[-1]["type"] == "run.waiting"


@ds.workflow(name="tests.stream.retry")
async def flaky_run(ctx: ds.Context) -> str:
    attempts: list[int] = []

    def sometimes() -> str:
        attempts.append(1)
        if len(attempts) < 2:
            raise ConnectionError("flaky upstream")
        return "ok"

    return await ctx.step("call", sometimes, retry=ds.RetryPolicy(max_attempts=3, initial_interval=0, jitter=False))


async def test_stream_reports_retries(tmp_path: Path) -> None:
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"))
    state = await engine.run(flaky_run, run_id="s3")
    assert state.status == "succeeded"
    types = [e["type"] for e in [e async for e in engine.stream("s3")] if e.get("opId") == "call"]
    assert types == ["step.started", "step.retrying", "step.started", "step.completed"]
    await engine.aclose()


async def test_each_sandbox_lifecycle_operation_is_one_event(tmp_path: Path) -> None:
    from durable_sandbox.providers.local import LocalProvider

    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": LocalProvider(tmp_path / "home")})
    spec = {
        "toolCalls": [{"type": "shell", "command": f"echo {i}"} for i in range(3)],
        "snapshotEveryNCalls": 1,
        "injectLossAfterNCalls": 2,
    }
    state = await engine.run("sandbox-agent", spec, run_id="ev")
    assert state.status == "succeeded", state.error
    types = [e["type"] for e in [e async for e in engine.stream("ev")]]
    assert types.count("sandbox.provisioned") == 1
    assert types.count("sandbox.snapshot") == 3
    assert types.count("sandbox.loss_injected") == 1
    assert types.count("sandbox.lost") == 1, "the loss itself, with its reason, once"
    assert types.count("sandbox.recovered") == 1
    await engine.aclose()


async def test_a_misspelt_option_of_a_new_run_is_refused_before_a_run_exists(tmp_path: Path) -> None:
    # The options of a new run are one TypedDict (engine/client.py NewRun) for every way to create one; a
    # name not among them is a TypeError, as a keyword signature would raise, not a silently ignored option.
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"))
    for create in (engine.run, engine.create, engine.start, engine.client.create):
        with pytest.raises(TypeError, match="run_idd"):
            await create(counter, "a", run_idd="t1")  # type: ignore[call-arg]
    assert await engine.store.list_runs() == []
