"""ctx.parallel: list and dict forms, child-context branches with scoped ids, per-branch failures and
resuming only the failed branches."""

import asyncio
import functools

import pytest
from pydantic import BaseModel

from durable_sandbox.engine import ParallelError, workflow
from tests.unit.engine_support import ops


async def test_parallel_list_form(engine):
    calls = []

    async def three():
        calls.append(3)
        return 3

    @workflow(name="par-list")
    async def wf(ctx):
        return await ctx.parallel("p", [lambda: calls.append(1) or 1, lambda: calls.append(2) or 2, three])

    st = await engine.run(wf, run_id="pl")
    assert st.status == "succeeded", st.error
    assert st.result == [1, 2, 3]
    assert sorted(calls) == [1, 2, 3]
    o = ops(st)
    assert {k: o[k].status for k in ("p", "p/0", "p/1", "p/2")} == dict.fromkeys(
        ("p", "p/0", "p/1", "p/2"), "completed"
    )
    assert o["p"].kind == "parallel" and o["p/1"].result == 2


async def test_parallel_dict_form_and_replay_calls_nothing(engine):
    calls = []

    @workflow(name="par-dict")
    async def wf(ctx):
        out = await ctx.parallel(
            "work", {"b": lambda: calls.append("b") or "B", "a": lambda: calls.append("a") or "A"}
        )
        await ctx.callback("go")
        return out

    st = await engine.run(wf, run_id="pd")
    assert st.status == "waiting"
    await engine.signal("pd", "go", None)
    st = await engine.resume("pd")
    assert st.status == "succeeded", st.error
    assert st.result == {"b": "B", "a": "A"}
    assert list(st.result) == ["b", "a"]
    assert sorted(calls) == ["a", "b"]
    assert {"work/a", "work/b"} <= set(ops(st))


async def test_parallel_branches_really_run_concurrently(engine):
    both_started = asyncio.Event()
    started = []

    async def branch(name):
        started.append(name)
        if len(started) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 5)  # deadlocks (times out) if run one after the other
        return name

    @workflow(name="par-concurrent")
    async def wf(ctx):
        return await ctx.parallel("p", {"x": lambda: branch("x"), "y": lambda: branch("y")})

    st = await engine.run(wf, run_id="pc")
    assert st.status == "succeeded", st.error
    assert st.result == {"x": "x", "y": "y"}


async def test_parallel_max_concurrency(engine):
    active = [0]
    peak = [0]

    async def branch():
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        for _ in range(5):
            await asyncio.sleep(0)
        active[0] -= 1
        return 1

    @workflow(name="par-max-concurrency")
    async def wf(ctx):
        return await ctx.parallel("p", [branch] * 6, max_concurrency=2)

    st = await engine.run(wf, run_id="pm")
    assert st.status == "succeeded" and st.result == [1] * 6
    assert peak[0] == 2


async def test_child_context_branches_get_scoped_ids(engine):
    calls = []

    async def branch_a(ctx):
        v = await ctx.step("inner", lambda: calls.append("a/inner") or 10)
        w = await ctx.step("second", lambda: calls.append("a/second") or 1)
        return v + w

    async def branch_b(ctx):
        return await ctx.step("inner", lambda: calls.append("b/inner") or 20)

    @workflow(name="par-child-ctx")
    async def wf(ctx):
        out = await ctx.parallel("p", {"a": branch_a, "b": branch_b, "c": lambda: "plain"})
        await ctx.callback("go")
        return out

    st = await engine.run(wf, run_id="pcc")
    o = ops(st)
    assert {"p", "p/a", "p/b", "p/c", "p/a/inner", "p/a/second", "p/b/inner"} <= set(o)
    assert o["p/a/inner"].result == 10 and o["p/b/inner"].result == 20 and o["p/a"].result == 11
    assert "inner" not in o  # ids are scoped, not global
    await engine.signal("pcc", "go", None)
    st = await engine.resume("pcc")
    assert st.status == "succeeded", st.error
    assert st.result == {"a": 11, "b": 20, "c": "plain"}
    assert sorted(calls) == ["a/inner", "a/second", "b/inner"]


async def test_nested_parallel_scopes(engine):
    async def outer_branch(ctx):
        return await ctx.parallel("q", {"x": lambda: 1, "y": lambda: 2})

    @workflow(name="par-nested")
    async def wf(ctx):
        return await ctx.parallel("p", {"o": outer_branch})

    st = await engine.run(wf, run_id="pn")
    assert st.status == "succeeded", st.error
    assert st.result == {"o": {"x": 1, "y": 2}}
    assert {"p/o/q", "p/o/q/x", "p/o/q/y"} <= set(ops(st))


async def test_partial_failure_names_each_failed_key_and_resume_reruns_only_failed(engine):
    calls = {"a": 0, "b": 0, "c": 0, "c-inner": 0, "after": 0}
    broken = {"b": True, "c": True}

    def a():
        calls["a"] += 1
        return "A"

    def b():
        calls["b"] += 1
        if broken["b"]:
            raise ValueError("b is broken")
        return "B"

    async def c(ctx):
        calls["c"] += 1
        ok = await ctx.step("ok", lambda: calls.__setitem__("c-inner", calls["c-inner"] + 1) or "fine")

        def fragile():
            if broken["c"]:
                raise KeyError("c is broken")
            return ok + "!"

        return await ctx.step("fragile", fragile)

    caught = []

    @workflow(name="par-partial-failure")
    async def wf(ctx):
        try:
            out = await ctx.parallel("p", {"a": a, "b": b, "c": c})
        except ParallelError as exc:
            caught.append(sorted(exc.failures))
            raise
        calls["after"] += 1
        return out

    st = await engine.run(wf, run_id="pf")
    assert st.status == "failed"
    assert caught == [["b", "c"]]
    msg = st.error["message"]
    assert "'p'" in msg and "b" in msg and "c" in msg and "b is broken" in msg and "c is broken" in msg
    assert st.error["details"]["failures"].keys() == {"b", "c"}
    o = ops(st)
    assert (
        o["p/a"].status == "completed" and o["p/b"].status == "failed" and o["p/c/fragile"].status == "failed"
    )
    assert calls == {"a": 1, "b": 1, "c": 1, "c-inner": 1, "after": 0}

    broken.update(b=False, c=False)
    st = await engine.resume("pf")
    assert st.status == "succeeded", st.error
    assert st.result == {"a": "A", "b": "B", "c": "fine!"}
    # a completed and is not called again; inside branch c, the completed "ok" step is not re-run either.
    assert calls == {"a": 1, "b": 2, "c": 2, "c-inner": 1, "after": 1}
    assert ops(st)["p/b"].attempt == 2


async def test_parallel_error_str_and_group(engine):
    @workflow(name="par-error-group")
    async def wf(ctx):
        try:
            await ctx.parallel("p", {"x": lambda: 1 / 0, "y": lambda: 1})
        except ParallelError as exc:
            return {"str": str(exc), "n": len(exc.exceptions), "keys": list(exc.failures)}

    st = await engine.run(wf, run_id="pe")
    assert st.status == "succeeded", st.error
    assert st.result["keys"] == ["x"] and st.result["n"] == 1
    assert "x: StepFailed" in st.result["str"] and "ZeroDivisionError" in st.result["str"]


async def test_parallel_rejects_bad_branch_keys(engine):
    @workflow(name="par-bad-key")
    async def wf(ctx):
        await ctx.parallel("p", {"a/b": lambda: 1})

    st = await engine.run(wf, run_id="pk")
    assert st.status == "failed"
    assert st.error["type"] == "ValueError" and "'a/b'" in st.error["message"]


@pytest.mark.parametrize("form", ["list", "dict"])
async def test_empty_parallel(engine, form):
    @workflow(name=f"par-empty-{form}")
    async def wf(ctx):
        return await ctx.parallel("p", [] if form == "list" else {})

    st = await engine.run(wf, run_id="pe0")
    assert st.status == "succeeded", st.error
    assert st.result == ([] if form == "list" else {})


class Verdict(BaseModel):
    ok: bool
    note: str


def _judge(note: str) -> Verdict:
    return Verdict(ok=True, note=note)


async def _judge_in_branch(ctx) -> Verdict:
    return Verdict(ok=False, note=await ctx.step("inner", lambda: "inner"))


@pytest.mark.parametrize("form", ["dict", "list"])
async def test_parallel_results_keep_their_type_after_replay(engine, form):
    """ctx.parallel revalidates each branch's recorded result through its return annotation, as
    ctx.step does: a pydantic model before a suspension is still a model after the replay."""
    branches = {"plain": functools.partial(_judge, "plain"), "ctx": _judge_in_branch}

    @workflow(name=f"par-types-{form}")
    async def wf(ctx):
        out = await ctx.parallel("p", branches if form == "dict" else list(branches.values()))
        await ctx.callback("go")  # suspends: the resume replays the completed parallel from the journal
        values = out.values() if form == "dict" else out
        return [type(v).__name__ for v in values] + [v.note for v in values]

    first = await engine.run(wf, run_id=f"pt-{form}")
    assert first.status == "waiting"
    await engine.signal(f"pt-{form}", "go", True)
    st = await engine.resume(f"pt-{form}")
    assert st.status == "succeeded", st.error
    assert st.result == ["Verdict", "Verdict", "plain", "inner"]
