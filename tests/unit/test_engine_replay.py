"""Replay: resuming re-executes the workflow from the top, and every completed operation returns its
recorded result without running. Side effects are counted outside the engine."""

import asyncio

import pytest

from durable_sandbox.engine import StepFailed, workflow
from tests.unit.engine_support import Crash, ops


@pytest.mark.parametrize("suspends", [True, False], ids=["c-suspends", "c-at-once"])
async def test_resume_after_crash_never_calls_a_completed_step(engine, tmp_path, suspends):
    log = tmp_path / "effects.log"
    crash_once = [True]

    def effect(name):
        with open(log, "a") as f:
            f.write(name + "\n")
        return name.upper()

    async def c_step():
        if suspends:
            await asyncio.sleep(0)
        effect("c")
        if crash_once.pop() if crash_once else False:
            raise Crash()
        return "C"

    @workflow(name="replay-crash")
    async def wf(ctx):
        a = await ctx.step("a", effect, "a")
        b = await ctx.step("b", effect, "b")
        c = await ctx.step("c", c_step)
        d = await ctx.step("d", effect, "d")
        return [a, b, c, d]

    with pytest.raises(Crash):
        await engine.run(wf, run_id="rc")
    st = await engine.inspect("rc")
    assert st.status == "running"
    assert "d" not in ops(st)
    if suspends:
        assert ops(st)["c"].status == "started"  # committed before c went on past its first await
    else:
        # c never suspends: its start was to be committed with its outcome, so the crash inside it left no
        # record of c. What was committed, a and b, is all there is.
        assert "c" not in ops(st)
    assert log.read_text().split() == ["a", "b", "c"]

    st = await engine.resume("rc")
    assert st.status == "succeeded", st.error
    assert st.result == ["A", "B", "C", "D"]
    # a and b were committed: never again. c started without completing: runs again (at-least-once).
    assert log.read_text().split() == ["a", "b", "c", "c", "d"]
    assert ops(st)["c"].attempt == 1  # the same attempt, re-run after the interruption


async def test_resume_after_signal_calls_nothing_twice(engine):
    calls = []

    @workflow(name="replay-signal")
    async def wf(ctx):
        x = await ctx.step("x", lambda: calls.append("x") or 1)
        ok = await ctx.callback("ok")
        y = await ctx.step("y", lambda: calls.append("y") or 2)
        return x + y + ok

    assert (await engine.run(wf, run_id="rs")).status == "waiting"
    assert calls == ["x"]
    await engine.signal("rs", "ok", 10)
    st = await engine.resume("rs")
    assert st.status == "succeeded" and st.result == 13
    assert calls == ["x", "y"]
    # Resuming a finished run is a no-op.
    st = await engine.resume("rs")
    assert st.result == 13 and calls == ["x", "y"]


@pytest.mark.parametrize("first", ["x", "y"])
async def test_gather_over_steps_replays_by_id_whatever_order_they_finished(engine, first):
    calls = []
    released = asyncio.Event()

    async def leader(name):
        calls.append(name)
        released.set()
        return f"value-{name}"

    async def follower(name):
        await released.wait()
        calls.append(name)
        return f"value-{name}"

    fx, fy = (leader, follower) if first == "x" else (follower, leader)

    @workflow(name=f"replay-gather-{first}")
    async def wf(ctx):
        x, y = await asyncio.gather(ctx.step("x", fx, "x"), ctx.step("y", fy, "y"))
        await ctx.callback("go")
        return {"x": x, "y": y}

    st = await engine.run(wf, run_id="g")
    assert st.status == "waiting"
    hist = await engine.history("g")
    completed = [r.op_id for r in hist if r.status == "completed"]
    assert completed == ([first, "y" if first == "x" else "x"])
    assert calls == completed

    await engine.signal("g", "go", None)
    st = await engine.resume("g")
    assert st.status == "succeeded", st.error
    assert st.result == {"x": "value-x", "y": "value-y"}
    assert calls == completed  # nothing ran again


async def test_replay_of_200_steps_calls_nothing(engine):
    calls = []

    def step(i):
        calls.append(i)
        return i * i

    @workflow(name="replay-200")
    async def wf(ctx):
        total = 0
        for i in range(200):
            total += await ctx.step(f"s-{i}", step, i)
        await ctx.callback("go")
        return total

    st = await engine.run(wf, run_id="big")
    assert st.status == "waiting"
    assert calls == list(range(200))
    await engine.signal("big", "go", None)
    st = await engine.resume("big")
    assert st.status == "succeeded"
    assert st.result == sum(i * i for i in range(200))
    assert calls == list(range(200))
    assert len(await engine.history("big")) == 200 * 2 + 2  # started+completed per step, callback twice


async def test_recorded_step_failure_is_raised_again_on_replay_without_running(engine):
    calls = []

    def fails():
        calls.append(1)
        raise ValueError("bad input")

    seen = []

    @workflow(name="replay-recorded-failure")
    async def wf(ctx):
        try:
            await ctx.step("f", fails)
        except StepFailed as exc:
            seen.append((exc.op_id, exc.error_type, exc.cause_message))
        return await ctx.callback("go")

    assert (await engine.run(wf, run_id="rf")).status == "waiting"
    await engine.signal("rf", "go", "done")
    st = await engine.resume("rf")
    assert st.status == "succeeded" and st.result == "done"
    assert calls == [1]
    assert seen == [("f", "ValueError", "bad input")] * 2


async def test_failed_run_resumed_retries_only_the_failed_step(engine):
    calls = []
    broken = [True]

    def maybe():
        calls.append("maybe")
        if broken[0]:
            raise RuntimeError("down")
        return "up"

    @workflow(name="replay-retry-failed-run")
    async def wf(ctx):
        a = await ctx.step("a", lambda: calls.append("a") or "a")
        return [a, await ctx.step("m", maybe)]

    st = await engine.run(wf, run_id="fr")
    assert st.status == "failed"
    broken[0] = False
    st = await engine.resume("fr")
    assert st.status == "succeeded", st.error
    assert st.result == ["a", "up"]
    assert calls == ["a", "maybe", "maybe"]
    assert ops(st)["m"].attempt == 2
