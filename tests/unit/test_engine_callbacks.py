"""ctx.callback / Engine.signal and the ctx.sleep durable timer."""

import asyncio

import pytest

from durable_sandbox.engine import CallbackTimeout, Engine, SignalConflict, workflow
from tests.unit.engine_support import ops


@pytest.mark.parametrize("order", [("a", "b", "c"), ("c", "b", "a"), ("b", "a", "c")])
async def test_several_pending_callbacks_resolved_by_id_in_any_order(engine, order):
    calls = []

    @workflow(name="cb-several")
    async def wf(ctx):
        await ctx.step("before", lambda: calls.append("before"))
        a, b, c = await asyncio.gather(
            ctx.callback("a", {"n": 1}), ctx.callback("b", {"n": 2}), ctx.callback("c", {"n": 3})
        )
        await ctx.step("after", lambda: calls.append("after"))
        return [a, b, c]

    st = await engine.run(wf, run_id="sev")
    assert st.status == "waiting"
    assert sorted((p.id, p.payload["n"]) for p in st.pending_callbacks) == [("a", 1), ("b", 2), ("c", 3)]

    remaining = {"a", "b", "c"}
    for cb in order:
        assert await engine.signal("sev", cb, f"value-{cb}") is True
        st = await engine.resume("sev")
        remaining.discard(cb)
        if remaining:
            assert st.status == "waiting"
            assert {p.id for p in st.pending_callbacks} == remaining
            assert ops(st)[cb].status == "completed" and ops(st)[cb].result == f"value-{cb}"
    assert st.status == "succeeded", st.error
    assert st.result == ["value-a", "value-b", "value-c"]
    assert calls == ["before", "after"]


async def test_signal_is_idempotent_for_the_same_value_and_conflicts_for_another(engine):
    @workflow(name="cb-idempotent")
    async def wf(ctx):
        return await ctx.callback("approve")

    await engine.run(wf, run_id="idem")
    assert await engine.signal("idem", "approve", {"ok": True, "by": "ann"}) is True
    # The same value again (key order aside) is a no-op.
    assert await engine.signal("idem", "approve", {"by": "ann", "ok": True}) is False
    with pytest.raises(SignalConflict, match="approve"):
        await engine.signal("idem", "approve", {"ok": False})
    st = await engine.resume("idem")
    assert st.status == "succeeded" and st.result == {"ok": True, "by": "ann"}
    # After completion, the same value is still a no-op and another value still conflicts.
    assert await engine.signal("idem", "approve", {"ok": True, "by": "ann"}) is False
    with pytest.raises(SignalConflict):
        await engine.signal("idem", "approve", 1)


async def test_signal_makes_waiting_run_pending_and_a_worker_finishes_it(engine):
    @workflow(name="cb-worker")
    async def wf(ctx):
        return await ctx.callback("approve")

    await engine.run(wf, run_id="w")
    assert (await engine.inspect("w")).status == "waiting"
    await engine.signal("w", "approve", 5)
    assert (await engine.inspect("w")).status == "pending"
    await engine.worker(idle_exit=True, poll_interval=0.01)
    st = await engine.inspect("w")
    assert st.status == "succeeded" and st.result == 5


async def test_signal_sent_before_the_run_reaches_the_callback(engine):
    reached = []

    @workflow(name="cb-early")
    async def wf(ctx):
        first = await ctx.callback("first")
        reached.append("second")
        second = await ctx.callback("second")
        return [first, second]

    st = await engine.run(wf, run_id="early")
    assert [p.id for p in st.pending_callbacks] == ["first"]
    assert await engine.signal("early", "second", "S") is True  # not reached yet: kept
    st = await engine.inspect("early")
    assert st.status == "waiting" and "second" not in ops(st)
    await engine.signal("early", "first", "F")
    st = await engine.resume("early")
    assert st.status == "succeeded", st.error
    assert st.result == ["F", "S"]
    assert reached == ["second"]


async def test_signal_before_the_run_ever_started(engine):
    @workflow(name="cb-before-start")
    async def wf(ctx):
        return await ctx.callback("cfg")

    await engine.create(wf, run_id="pre")
    await engine.signal("pre", "cfg", {"k": 1})
    st = await engine.resume("pre")
    assert st.status == "succeeded" and st.result == {"k": 1}


async def test_callbacks_inside_parallel_branches_get_scoped_ids(engine):
    async def reviewer(ctx):
        verdict = await ctx.callback("review", {"who": ctx.scope})
        return verdict

    @workflow(name="cb-parallel")
    async def wf(ctx):
        return await ctx.parallel("p", {"x": reviewer, "y": reviewer})

    st = await engine.run(wf, run_id="cbp")
    assert st.status == "waiting"
    assert sorted((p.id, p.payload["who"]) for p in st.pending_callbacks) == [
        ("p/x/review", "p/x/"),
        ("p/y/review", "p/y/"),
    ]
    await engine.signal("cbp", "p/y/review", "Y")
    st = await engine.resume("cbp")
    assert [p.id for p in st.pending_callbacks] == ["p/x/review"]
    await engine.signal("cbp", "p/x/review", "X")
    st = await engine.resume("cbp")
    assert st.status == "succeeded", st.error
    assert st.result == {"x": "X", "y": "Y"}


async def test_callback_timeout(engine, clock):
    @workflow(name="cb-timeout")
    async def wf(ctx):
        try:
            return await ctx.callback("approve", timeout=600)
        except CallbackTimeout as exc:
            return f"timed out: {exc}"

    t0 = clock.time()
    st = await engine.run(wf, run_id="cto")
    assert st.status == "waiting"
    assert st.wake_at is not None and t0 + 599 <= st.wake_at <= clock.time() + 600
    # Not due yet: resuming keeps it waiting with the same deadline.
    st = await engine.resume("cto")
    assert st.status == "waiting"
    deadline = st.wake_at
    clock.advance(601)
    await engine.worker(idle_exit=True, poll_interval=0.01)  # the run is due, so the worker picks it up
    st = await engine.inspect("cto")
    assert st.status == "succeeded", st.error
    assert st.result.startswith("timed out: ") and "'approve'" in st.result
    assert ops(st)["approve"].status == "failed" and ops(st)["approve"].error["type"] == "CallbackTimeout"
    assert deadline is not None
    # A late signal no longer changes the result.
    await engine.signal("cto", "approve", "late")
    assert (await engine.resume("cto")).result == st.result


async def test_callback_signalled_before_timeout(engine, clock):
    @workflow(name="cb-timeout-ok")
    async def wf(ctx):
        return await ctx.callback("approve", timeout=600)

    await engine.run(wf, run_id="ctok")
    clock.advance(300)
    await engine.signal("ctok", "approve", "yes")
    st = await engine.resume("ctok")
    assert st.status == "succeeded" and st.result == "yes"


async def test_short_sleep_completes_inline(engine):
    @workflow(name="sleep-short")
    async def wf(ctx):
        await ctx.sleep("nap", 0.01)
        return "woke"

    st = await engine.run(wf, run_id="s1")
    assert st.status == "succeeded" and st.result == "woke"
    nap = ops(st)["nap"]
    assert nap.kind == "sleep" and nap.status == "completed"
    rows = [(r.status, "wakeAt" in (r.meta or {})) for r in await engine.history("s1")]
    assert rows == [("started", True), ("completed", False)]


async def test_long_sleep_suspends_and_completes_when_due(engine, clock):
    calls = []

    @workflow(name="sleep-long")
    async def wf(ctx):
        await ctx.step("before", lambda: calls.append("before"))
        await ctx.sleep("nap", 3600)
        await ctx.step("after", lambda: calls.append("after"))
        return "woke"

    t0 = clock.time()
    st = await engine.run(wf, run_id="s2")
    assert st.status == "waiting"
    assert st.pending_callbacks == []
    assert st.wake_at is not None and abs(st.wake_at - (t0 + 3600)) < 5
    wake_at = st.wake_at
    assert ops(st)["nap"].status == "started"

    clock.advance(1800)  # not due: a resume keeps waiting, the timer is not restarted
    st = await engine.resume("s2")
    assert st.status == "waiting" and st.wake_at == wake_at
    assert await engine.store.claim_next("other", 10) is None  # a worker would not pick it yet

    clock.advance(1801)
    st = await engine.resume("s2")
    assert st.status == "succeeded", st.error
    assert st.result == "woke"
    assert calls == ["before", "after"]
    assert ops(st)["nap"].status == "completed"


async def test_due_sleep_is_picked_up_by_a_worker(engine, clock, store):
    @workflow(name="sleep-worker")
    async def wf(ctx):
        await ctx.sleep("nap", 100)
        return "done"

    await engine.run(wf, run_id="sw")
    other = Engine(store, worker_id="w2")
    await other.worker(idle_exit=True, poll_interval=0.01)
    assert (await engine.inspect("sw")).status == "waiting"
    clock.advance(101)
    await other.worker(idle_exit=True, poll_interval=0.01)
    assert (await engine.inspect("sw")).result == "done"
