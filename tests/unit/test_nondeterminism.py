"""Replay mismatches fail loudly (NonDeterminismError naming the operation, what was recorded and what
the code asked for), and ctx.patched lets old runs keep the old path while new runs take the new one.

"Changing the code" is re-registering the workflow name with another function, which is what a deploy
does; the run is interrupted by a simulated crash (a step raising Crash) or by waiting on a callback.
"""

import pytest

from durable_sandbox.engine import NonDeterminismError, workflow
from tests.unit.engine_support import Crash, ops


def fetch(x):
    return x + 1


def fetch_other(x):
    return x + 2


def identity(x):
    return x


async def crashing():
    raise Crash()


async def _crashed_run(engine, wf, run_id, inp=1):
    with pytest.raises(Crash):
        await engine.run(wf, inp, run_id=run_id)
    st = await engine.inspect(run_id)
    assert st.status == "running" and ops(st)["fetch"].status == "completed"


def _assert_nondeterminism(st, op_id, *fragments):
    assert st.status == "failed"
    assert st.error["type"] == NonDeterminismError.__name__
    msg = st.error["message"]
    assert f"{op_id!r}" in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


async def test_changed_step_input_is_detected(engine):
    calls = []

    @workflow(name="nd-input")
    async def v1(ctx, x):
        await ctx.step("fetch", fetch, x)
        await ctx.step("boom", crashing)

    await _crashed_run(engine, v1, "nd1")

    @workflow(name="nd-input")
    async def v2(ctx, x):
        await ctx.step("fetch", lambda y: calls.append(y), x * 10)  # same id, other input (and callable)
        return "unreachable"

    st = await engine.resume("nd1")
    msg = _assert_nondeterminism(st, "fetch", "recorded", "code asked for", "inputDigest")
    assert calls == []  # the changed step did not run
    assert st.error["details"]["opId"] == "fetch"
    assert st.error["details"]["expected"]["inputDigest"] != st.error["details"]["actual"]["inputDigest"]
    assert "ctx.patched" in msg


async def test_changed_step_input_only(engine):
    @workflow(name="nd-input-only")
    async def v1(ctx, x):
        await ctx.step("fetch", fetch, x)
        await ctx.step("boom", crashing)

    await _crashed_run(engine, v1, "nd1b")

    @workflow(name="nd-input-only")
    async def v2(ctx, x):
        await ctx.step("fetch", fetch, x + 1)
        return "unreachable"

    st = await engine.resume("nd1b")
    msg = _assert_nondeterminism(st, "fetch", "inputDigest: recorded")
    assert "kind:" not in msg and "name:" not in msg  # only what differs is reported


async def test_changed_step_function_is_detected(engine):
    @workflow(name="nd-name")
    async def v1(ctx, x):
        await ctx.step("fetch", fetch, x)
        await ctx.step("boom", crashing)

    await _crashed_run(engine, v1, "nd2")

    @workflow(name="nd-name")
    async def v2(ctx, x):
        await ctx.step("fetch", fetch_other, x)

    st = await engine.resume("nd2")
    _assert_nondeterminism(st, "fetch", "name: recorded 'fetch', code asked for 'fetch_other'")


async def test_changed_operation_kind_is_detected(engine):
    @workflow(name="nd-kind")
    async def v1(ctx, x):
        await ctx.step("fetch", fetch, x)
        await ctx.step("boom", crashing)

    await _crashed_run(engine, v1, "nd3")

    @workflow(name="nd-kind")
    async def v2(ctx, x):
        await ctx.callback("fetch")

    st = await engine.resume("nd3")
    _assert_nondeterminism(st, "fetch", "kind: recorded 'step', code asked for 'callback'")
    assert st.pending_callbacks == []


async def test_changed_step_id_is_detected(engine):
    calls = []

    @workflow(name="nd-id")
    async def v1(ctx, x):
        await ctx.step("fetch", fetch, x)
        await ctx.step("boom", crashing)

    await _crashed_run(engine, v1, "nd4")

    @workflow(name="nd-id")
    async def v2(ctx, x):
        calls.append("v2")
        await ctx.step("fetch-renamed", fetch, x)
        return "renamed"

    st = await engine.resume("nd4")
    msg = _assert_nondeterminism(st, "fetch", "opId: recorded 'fetch', code asked for 'fetch-renamed'")
    assert "kind:" not in msg  # same kind and function: only the id differs
    assert calls == ["v2"]
    assert st.error["details"]["expected"]["opId"] == "fetch"
    assert st.error["details"]["actual"]["opId"] == "fetch-renamed"


async def test_removed_completed_step_is_detected(engine):
    @workflow(name="nd-removed")
    async def v1(ctx, x):
        await ctx.step("fetch", fetch, x)
        await ctx.step("boom", crashing)

    await _crashed_run(engine, v1, "nd4b")

    @workflow(name="nd-removed")
    async def v2(ctx, x):
        return "nothing"

    st = await engine.resume("nd4b")
    _assert_nondeterminism(st, "fetch", "never reached")


async def test_patched_inside_parallel_branch_is_scoped(engine):
    @workflow(name="nd-patched-scoped")
    async def wf(ctx):
        async def branch(ctx):
            return ctx.patched("fix")

        return await ctx.parallel("p", {"a": branch})

    st = await engine.run(wf, run_id="nd-scope")
    assert st.status == "succeeded", st.error
    assert st.result == {"a": True}
    assert ops(st)["p/a/patch:fix"].kind == "patch"


async def test_changed_callback_payload_is_detected(engine):
    @workflow(name="nd-callback")
    async def v1(ctx):
        return await ctx.callback("approve", {"amount": 10})

    assert (await engine.run(v1, run_id="nd5")).status == "waiting"

    @workflow(name="nd-callback")
    async def v2(ctx):
        return await ctx.callback("approve", {"amount": 99})

    await engine.signal("nd5", "approve", True)
    st = await engine.resume("nd5")
    _assert_nondeterminism(st, "approve", "inputDigest")


async def test_check_input_false_opts_out(engine):
    @workflow(name="nd-opt-out")
    async def v1(ctx, x):
        v = await ctx.step("fetch", fetch, x, check_input=False)
        await ctx.step("boom", crashing)
        return v

    await _crashed_run(engine, v1, "nd6")

    @workflow(name="nd-opt-out")
    async def v2(ctx, x):
        return await ctx.step("fetch", fetch, x + 100, check_input=False)

    st = await engine.resume("nd6")
    assert st.status == "succeeded", st.error
    assert st.result == 2  # the recorded result, not a re-run with the new input


async def test_unchanged_code_replays_without_error(engine):
    @workflow(name="nd-same")
    async def wf(ctx, x):
        a = await ctx.step("fetch", fetch, x)
        b = await ctx.callback("cb", {"a": a})
        return a + b

    await engine.run(wf, 1, run_id="nd7")
    await engine.signal("nd7", "cb", 5)
    st = await engine.resume("nd7")
    assert st.status == "succeeded" and st.result == 7


async def test_patched_old_run_keeps_old_path_new_run_takes_new_path(engine):
    calls = []

    def old_path(tag):
        calls.append(("old", tag))
        return "old"

    def new_path(tag):
        calls.append(("new", tag))
        return "new"

    @workflow(name="nd-patched")
    async def v1(ctx, tag):
        await ctx.step("prepare", identity, tag)
        how = await ctx.step("ship", old_path, tag)
        await ctx.callback("approve")
        return how

    st = await engine.run(v1, "run1", run_id="old")
    assert st.status == "waiting" and calls == [("old", "run1")]

    patched_seen = []

    @workflow(name="nd-patched")
    async def v2(ctx, tag):
        await ctx.step("prepare", identity, tag)
        if ctx.patched("ship-v2"):
            patched_seen.append((tag, True))
            how = await ctx.step("ship-v2", new_path, tag)
        else:
            patched_seen.append((tag, False))
            how = await ctx.step("ship", old_path, tag)
        await ctx.callback("approve")
        return how

    # The old run, resumed on v2 code, replays its recorded old path and runs nothing again.
    await engine.signal("old", "approve", True)
    st = await engine.resume("old")
    assert st.status == "succeeded", st.error
    assert st.result == "old"
    assert patched_seen == [("run1", False)]
    assert ops(st)["patch:ship-v2"].kind == "patch" and ops(st)["patch:ship-v2"].result is False

    # A new run on v2 takes the new path.
    st = await engine.run(v2, "run2", run_id="new")
    assert st.status == "waiting"
    assert ("new", "run2") in calls and ("old", "run2") not in calls
    assert patched_seen[-1] == ("run2", True)
    await engine.signal("new", "approve", True)
    st = await engine.resume("new")
    assert st.status == "succeeded" and st.result == "new"
    # The patch decision is recorded: replays keep the same answer.
    assert patched_seen[-1] == ("run2", True)
    patch_rows = [r for r in await engine.history("new") if r.kind == "patch"]
    assert [(r.op_id, r.result) for r in patch_rows] == [("patch:ship-v2", True)]
    assert calls == [("old", "run1"), ("new", "run2")]


async def test_patched_answer_is_recorded_for_old_run(engine):
    """The old run records False the first time it reaches the marker; a later replay keeps False
    even though, by then, nothing recorded before the marker is left unreached."""
    seen = []

    @workflow(name="nd-patched-sticky")
    async def v1(ctx):
        await ctx.step("a", identity, 1)
        await ctx.callback("one")
        await ctx.callback("two")
        return "v1"

    await engine.run(v1, run_id="sticky")
    await engine.signal("sticky", "one", 1)

    @workflow(name="nd-patched-sticky")
    async def v2(ctx):
        await ctx.step("a", identity, 1)
        seen.append(ctx.patched("extra"))
        await ctx.callback("one")
        await ctx.callback("two")
        return "v2"

    st = await engine.resume("sticky")  # replays a, reaches the marker with 'one' still unreached
    assert st.status == "waiting"
    await engine.signal("sticky", "two", 2)
    st = await engine.resume("sticky")
    assert st.status == "succeeded", st.error
    assert seen == [False, False]
    assert [(r.op_id, r.result) for r in await engine.history("sticky") if r.kind == "patch"] == [
        ("patch:extra", False)
    ]


async def test_code_change_after_a_real_crash_is_detected(db_path, tmp_path, clock, monkeypatch):
    """A child process running crash-seq is SIGKILLed after s2 committed; the 'redeployed' code (this
    process) passes s1 another input. Resuming fails loudly and runs nothing."""
    import importlib

    workflow_mod = importlib.import_module(
        "durable_sandbox.engine.workflow"
    )  # the package re-exports `workflow`
    from tests.unit import crash_worker
    from tests.unit.crash_support import LEASE_TTL, _crash, _log

    log = tmp_path / "effects.log"
    assert await _crash(db_path, "nd-real", "crash-seq", log, fault="after:s2") == ["s1", "s2"]

    async def v2(ctx, inp):
        out = []
        for name in ("s1", "s2", "s3"):
            out.append(await ctx.step(name, crash_worker.effect, inp["log"] + ".moved", name))
        return out

    monkeypatch.setitem(workflow_mod._REGISTRY, "crash-seq", workflow_mod._define(v2, "crash-seq", "2"))
    clock.advance(LEASE_TTL + 1)
    from durable_sandbox.engine import Engine
    from durable_sandbox.stores import SqliteStore

    store = SqliteStore(db_path)
    try:
        st = await Engine(store).resume("nd-real")
    finally:
        await store.close()
    _assert_nondeterminism(st, "s1", "inputDigest: recorded")
    assert _log(log) == ["s1", "s2"]
    assert not (tmp_path / "effects.log.moved").exists()
