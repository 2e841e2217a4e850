"""ctx.step: sync/async, commit-before-continue, JSON results, pydantic round-trip, retries, timeouts,
duplicate ids, RunState shape, history, inspect, cancel, and the cross-run step cache."""

import asyncio
import json
import sqlite3
import threading
import time

import pytest
from pydantic import BaseModel

import durable_sandbox.engine.step_calls as step_calls
from durable_sandbox.engine import (
    DuplicateOperationError,
    RetryPolicy,
    RunNotFound,
    StepFailed,
    StepTimeout,
    workflow,
)
from tests.unit.engine_support import ops


class Point(BaseModel):
    x: int
    y: int


def make_point(x: int, y: int) -> Point:
    return Point(x=x, y=y)


def make_points(n: int) -> list[Point]:
    return [Point(x=i, y=-i) for i in range(n)]


class Opaque:
    pass


# ---------------------------------------------------------------------------------------------- basics


async def test_sync_and_async_steps_run_and_are_journaled(engine):
    calls = []

    def add(a, b):
        calls.append(("add", a, b))
        return a + b

    async def mul(a, b):
        await asyncio.sleep(0)
        calls.append(("mul", a, b))
        return a * b

    @workflow(name="steps-basic")
    async def wf(ctx, inp):
        x = await ctx.step("add", add, inp["a"], inp["b"])
        y = await ctx.step("mul", mul, x, b=10)
        return {"x": x, "y": y}

    st = await engine.run(wf, {"a": 2, "b": 3}, run_id="basic")
    assert st.status == "succeeded", st.error
    assert st.result == {"x": 5, "y": 50}
    assert calls == [("add", 2, 3), ("mul", 5, 10)]
    o = ops(st)
    assert [o["add"].status, o["mul"].status] == ["completed", "completed"]
    assert o["add"].result == 5 and o["mul"].result == 50
    assert o["add"].kind == "step" and o["add"].name.endswith("add")
    assert o["add"].input_digest and o["add"].input_digest != o["mul"].input_digest


async def test_result_is_committed_before_next_step_starts(engine, db_path):
    """The second step reads the database file over its own connection: the first step's completion
    (with its result) must already be committed, not merely buffered in the engine."""

    def first():
        return {"answer": 42}

    def second():
        con = sqlite3.connect(db_path)
        try:
            rows = con.execute(
                "SELECT op_id, status, result FROM ops WHERE run_id='commit' ORDER BY seq"
            ).fetchall()
        finally:
            con.close()
        return [[op, status, json.loads(res) if res else None] for op, status, res in rows]

    @workflow(name="steps-commit-order")
    async def wf(ctx):
        await ctx.step("first", first)
        return await ctx.step("second", second)

    st = await engine.run(wf, run_id="commit")
    assert st.status == "succeeded", st.error
    assert st.result == [
        ["first", "started", None],
        ["first", "completed", {"answer": 42}],
        ["second", "started", None],
    ]


async def test_non_json_result_raises_serialization_error_naming_the_step(engine):
    @workflow(name="steps-non-json")
    async def wf(ctx):
        try:
            await ctx.step("bad-result", Opaque)
        except StepFailed as exc:
            caught = {"type": exc.error_type, "message": str(exc)}
        await ctx.callback("go")
        return caught

    st = await engine.run(wf, run_id="nonjson")
    assert st.status == "waiting", st.error
    assert ops(st)["bad-result"].status == "failed"
    await engine.signal("nonjson", "go", True)
    st = await engine.resume("nonjson")  # the replay raises the very same error from the journal
    assert st.status == "succeeded", st.error
    assert st.result["type"] == "SerializationError"
    assert "'bad-result'" in st.result["message"] and "not JSON-serializable" in st.result["message"]


async def test_non_json_result_fails_the_run_with_serialization_error(engine):
    @workflow(name="steps-non-json-uncaught")
    async def wf(ctx):
        await ctx.step("bad", lambda: {"o": Opaque()})

    st = await engine.run(wf, run_id="nonjson2")
    assert st.status == "failed"
    assert st.error["type"] == "StepFailed"
    assert "'bad'" in st.error["message"] and "SerializationError" in st.error["message"]


async def test_pydantic_results_round_trip_and_are_revalidated_on_replay(engine):
    seen = []

    @workflow(name="steps-pydantic")
    async def wf(ctx):
        p = await ctx.step("point", make_point, 1, 2)
        pts = await ctx.step("points", make_points, 2)
        seen.append((type(p), p, [type(q) for q in pts]))
        await ctx.callback("go")
        return {"p": p, "pts": pts}

    st = await engine.run(wf, run_id="pyd")
    assert st.status == "waiting"
    o = ops(st)
    assert o["point"].result == {"x": 1, "y": 2}  # stored as JSON, not pickled
    assert o["points"].result == [{"x": 0, "y": 0}, {"x": 1, "y": -1}]
    await engine.signal("pyd", "go", None)
    st = await engine.resume("pyd")
    assert st.status == "succeeded", st.error
    assert len(seen) == 2
    for typ, p, inner in seen:  # first execution and replay see the same model types
        assert typ is Point and p == Point(x=1, y=2)
        assert inner == [Point, Point]
    assert st.result == {"p": {"x": 1, "y": 2}, "pts": [{"x": 0, "y": 0}, {"x": 1, "y": -1}]}


# ---------------------------------------------------------------------------------------------- retries


async def test_retry_journals_every_attempt(engine):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ValueError(f"boom {len(attempts)}")
        return "ok"

    @workflow(name="steps-retry")
    async def wf(ctx):
        return await ctx.step(
            "flaky", flaky, retry=RetryPolicy(max_attempts=5, initial_interval=0, jitter=False)
        )

    st = await engine.run(wf, run_id="retry")
    assert st.status == "succeeded", st.error
    assert st.result == "ok"
    assert len(attempts) == 3
    hist = [r for r in await engine.history("retry") if r.op_id == "flaky"]
    assert [(r.status, r.attempt) for r in hist] == [
        ("started", 1),
        ("failed", 1),
        ("started", 2),
        ("failed", 2),
        ("started", 3),
        ("completed", 3),
    ]
    failed = [r for r in hist if r.status == "failed"]
    assert [r.error.message for r in failed] == ["boom 1", "boom 2"]
    assert all(r.error.type == "ValueError" for r in failed)
    assert all("nextAttemptAt" in r.meta for r in failed)
    assert ops(st)["flaky"].attempt == 3


async def test_retry_gives_up_after_max_attempts(engine):
    calls = []

    def always():
        calls.append(1)
        raise RuntimeError("nope")

    @workflow(name="steps-retry-exhausted")
    async def wf(ctx):
        try:
            await ctx.step(
                "always", always, retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=False)
            )
        except StepFailed as exc:
            return {"attempts": exc.attempts, "type": exc.error_type, "msg": str(exc)}

    st = await engine.run(wf, run_id="exhaust")
    assert st.status == "succeeded", st.error
    assert len(calls) == 3
    assert st.result["attempts"] == 3 and st.result["type"] == "RuntimeError"
    assert "'always'" in st.result["msg"] and "3 attempt" in st.result["msg"]
    hist = [r for r in await engine.history("exhaust") if r.op_id == "always"]
    assert [(r.status, r.attempt) for r in hist] == [
        ("started", 1),
        ("failed", 1),
        ("started", 2),
        ("failed", 2),
        ("started", 3),
        ("failed", 3),
    ]
    assert "nextAttemptAt" not in (hist[-1].meta or {})


class Fatal(Exception):
    pass


class SaysNoRetry(Exception):
    retryable = False


@pytest.mark.parametrize("exc_type", [Fatal, SaysNoRetry])
async def test_non_retryable_errors_are_not_retried(engine, exc_type):
    calls = []

    def fails():
        calls.append(1)
        raise exc_type("fatal")

    @workflow(name=f"steps-non-retryable-{exc_type.__name__}")
    async def wf(ctx):
        await ctx.step(
            "f", fails, retry=RetryPolicy(max_attempts=5, initial_interval=0, non_retryable=(Fatal,))
        )

    st = await engine.run(wf, run_id="nr")
    assert st.status == "failed"
    assert len(calls) == 1
    assert st.error["type"] == "StepFailed" and exc_type.__name__ in st.error["message"]
    assert [(r.status, r.attempt) for r in await engine.history("nr")] == [("started", 1), ("failed", 1)]


def test_retry_policy_backoff_is_capped():
    p = RetryPolicy(max_attempts=10, initial_interval=1, backoff=2, max_interval=5, jitter=False)
    assert [p.delay(a) for a in range(1, 6)] == [1, 2, 4, 5, 5]
    j = RetryPolicy(initial_interval=4, jitter=True)
    assert all(2 <= j.delay(1) <= 4 for _ in range(50))
    assert not p.should_retry(ValueError(), 10)


# ---------------------------------------------------------------------------------------------- timeouts


async def test_step_timeout(engine):
    async def hangs():
        await asyncio.Event().wait()

    @workflow(name="steps-timeout")
    async def wf(ctx):
        try:
            await ctx.step("hang", hangs, timeout=0.05)
        except StepFailed as exc:
            return {"type": exc.error_type, "msg": str(exc)}

    st = await engine.run(wf, run_id="to")
    assert st.status == "succeeded", st.error
    assert st.result["type"] == StepTimeout.__name__
    assert "'hang'" in st.result["msg"] and "timed out" in st.result["msg"]
    rec = ops(st)["hang"]
    assert rec.status == "failed" and rec.error["type"] == "StepTimeout" and rec.error["retryable"] is True


async def test_step_timeout_is_retried_by_policy(engine):
    calls = []

    async def slow_then_fast():
        calls.append(1)
        if len(calls) == 1:
            await asyncio.Event().wait()
        return "fast"

    @workflow(name="steps-timeout-retry")
    async def wf(ctx):
        return await ctx.step(
            "s",
            slow_then_fast,
            timeout=0.05,
            retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=False),
        )

    st = await engine.run(wf, run_id="to2")
    assert st.status == "succeeded", st.error
    assert st.result == "fast" and len(calls) == 2
    hist = await engine.history("to2")
    assert [(r.status, r.attempt, r.error.type if r.error else None) for r in hist] == [
        ("started", 1, None),
        ("failed", 1, "StepTimeout"),
        ("started", 2, None),
        ("completed", 2, None),
    ]


# ---------------------------------------------------------------------------------------------- ids


async def test_duplicate_op_id_in_one_run(engine):
    calls = []

    @workflow(name="steps-dup")
    async def wf(ctx):
        await ctx.step("same", lambda: calls.append(1))
        try:
            await ctx.step("same", lambda: calls.append(2))
        except DuplicateOperationError as exc:
            return str(exc)

    st = await engine.run(wf, run_id="dup")
    assert st.status == "succeeded", st.error
    assert calls == [1]
    assert "'same'" in st.result and "twice" in st.result


async def test_duplicate_op_id_across_kinds_fails_the_run(engine):
    @workflow(name="steps-dup-kinds")
    async def wf(ctx):
        await ctx.step("x", lambda: 1)
        await ctx.sleep("x", 0)

    st = await engine.run(wf, run_id="dup2")
    assert st.status == "failed"
    assert st.error["type"] == "DuplicateOperationError" and "'x'" in st.error["message"]


# ---------------------------------------------------------------------------------------------- state shape


async def test_run_state_json_shape(engine):
    @workflow(name="steps-shape")
    async def wf(ctx, inp):
        v = await ctx.step("one", lambda: 1)
        return await ctx.callback("approve", {"amount": inp["amount"], "v": v})

    st = await engine.run(wf, {"amount": 7}, run_id="shape")
    data = st.to_json()
    json.dumps(data)  # plain JSON
    for key in (
        "runId",
        "workflow",
        "status",
        "result",
        "error",
        "pendingCallbacks",
        "operations",
        "snapshots",
        "recoveryCount",
        "createdAt",
        "updatedAt",
    ):
        assert key in data, key
    assert not [k for k in data if "_" in k], data.keys()
    assert data["runId"] == "shape" and data["workflow"] == "steps-shape" and data["status"] == "waiting"
    assert data["pendingCallbacks"] == [{"id": "approve", "payload": {"amount": 7, "v": 1}}]
    assert data["snapshots"] == [] and data["recoveryCount"] == 0 and data["result"] is None
    assert isinstance(data["createdAt"], float) and data["createdAt"] <= data["updatedAt"]
    op = next(o for o in data["operations"] if o["opId"] == "one")
    assert {"opId", "kind", "name", "status", "attempt", "inputDigest", "result"} <= set(op)
    assert not [k for k in op if "_" in k]
    assert op["result"] == 1 and op["status"] == "completed"

    await engine.signal("shape", "approve", "yes")
    done = (await engine.resume("shape")).to_json()
    assert done["status"] == "succeeded" and done["result"] == "yes" and done["pendingCallbacks"] == []
    assert done["createdAt"] == data["createdAt"] and done["updatedAt"] >= data["updatedAt"]


async def test_failed_run_state_has_structured_error(engine):
    @workflow(name="steps-fail-shape")
    async def wf(ctx):
        await ctx.step("boom", lambda: 1 / 0)

    st = (await engine.run(wf, run_id="fs")).to_json()
    assert st["status"] == "failed"
    assert st["error"]["type"] == "StepFailed"
    assert "ZeroDivisionError" in st["error"]["message"] and "'boom'" in st["error"]["message"]
    op = next(o for o in st["operations"] if o["opId"] == "boom")
    assert op["error"]["type"] == "ZeroDivisionError"


async def test_unknown_run_raises_run_not_found(engine):
    with pytest.raises(RunNotFound, match="nope"):
        await engine.inspect("nope")
    with pytest.raises(RunNotFound):
        await engine.history("nope")
    with pytest.raises(RunNotFound):
        await engine.resume("nope")
    with pytest.raises(RunNotFound):
        await engine.signal("nope", "cb", 1)
    with pytest.raises(RunNotFound):
        await engine.cancel("nope")


# ---------------------------------------------------------------------------------------------- cancel


async def test_cancel_a_run_blocked_in_a_long_step(engine):
    entered = asyncio.Event()
    effects = []

    async def long_step():
        entered.set()
        await asyncio.Event().wait()  # only cancellation ends this
        effects.append("long finished")

    @workflow(name="steps-cancel")
    async def wf(ctx):
        await ctx.step("long", long_step)
        await ctx.step("after", lambda: effects.append("after"))

    run_id = await engine.start(wf, run_id="cx")
    await asyncio.wait_for(entered.wait(), 5)
    assert (await engine.inspect(run_id)).status == "running"
    st = await engine.cancel(run_id, "user said stop")
    assert st.status == "cancelled"
    assert st.error["message"] == "user said stop"
    assert ops(st)["long"].status == "started"
    assert "after" not in ops(st)
    assert effects == []
    # Resuming a cancelled run does nothing.
    st = await engine.resume(run_id)
    assert st.status == "cancelled" and effects == []


async def test_cancel_a_waiting_run(engine):
    @workflow(name="steps-cancel-waiting")
    async def wf(ctx):
        await ctx.callback("never")

    st = await engine.run(wf, run_id="cw")
    assert st.status == "waiting"
    st = await engine.cancel("cw")
    assert st.status == "cancelled" and st.pending_callbacks == []
    # Cancelling again is a no-op on a terminal run.
    assert (await engine.cancel("cw")).status == "cancelled"


# ---------------------------------------------------------------------------------------------- cache


async def test_cache_hits_across_runs_and_expires_by_ttl(engine, clock):
    calls = []

    def expensive(x) -> int:
        calls.append(x)
        return x * 2

    @workflow(name="steps-cache")
    async def wf(ctx, x):
        return await ctx.step("e", expensive, x, cache_key=f"exp-{x}", cache_ttl=60)

    async def run(run_id, x=2):
        st = await engine.run(wf, x, run_id=run_id)
        assert st.status == "succeeded", st.error
        return st.result, ops(st)["e"].meta

    assert await run("c1") == (4, {"cache": "miss", "cacheKey": "exp-2"})
    assert calls == [2]
    result, meta = await run("c2")
    assert result == 4 and meta["cache"] == "hit" and meta["cacheKey"] == "exp-2"
    assert calls == [2]
    assert (await run("c3", 3))[1]["cache"] == "miss"  # another key
    assert calls == [2, 3]
    hist = await engine.history("c2")
    assert [(r.op_id, r.status, (r.meta or {}).get("cache")) for r in hist] == [("e", "completed", "hit")]

    clock.advance(59)
    assert (await run("c4"))[1]["cache"] == "hit"
    clock.advance(2)  # past the 60 s TTL
    assert (await run("c5"))[1]["cache"] == "miss"
    assert calls == [2, 3, 2]
    assert (await run("c6"))[1]["cache"] == "hit"


async def test_clear_cache(engine):
    calls = []

    @workflow(name="steps-cache-clear")
    async def wf(ctx, x):
        return await ctx.step("e", lambda: calls.append(x) or x, cache_key=f"k-{x}")

    for i, x in enumerate([1, 2, 1, 2]):
        await engine.run(wf, x, run_id=f"a{i}")
    assert calls == [1, 2]
    assert await engine.clear_cache("k-1") == 1
    await engine.run(wf, 1, run_id="b1")
    await engine.run(wf, 2, run_id="b2")
    assert calls == [1, 2, 1]
    assert await engine.clear_cache(prefix="k-") == 2
    await engine.run(wf, 2, run_id="c2")
    assert calls == [1, 2, 1, 2]
    assert await engine.clear_cache() == 1
    assert await engine.clear_cache() == 0


# ---------------------------------------------------------------------------------------------- sync steps inline


def _where(log: list[str], slow: threading.Event) -> int:
    log.append("loop" if threading.current_thread() is threading.main_thread() else "thread")
    if slow.is_set():
        time.sleep(step_calls.SLOW_SECONDS * 2)  # the work itself is slow here, not a wait for something
    return len(log)


@pytest.fixture
def roomy_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick and slow with room for a loaded machine: a no-op preempted for a few ms must not count as
    slow, and nothing learnt about _where by other tests carries over."""
    monkeypatch.setattr(step_calls, "QUICK_SECONDS", 1.0)
    monkeypatch.setattr(step_calls, "SLOW_SECONDS", 0.5)
    monkeypatch.setattr(step_calls, "_observed", {})


def _where_loop(name: str, log: list[str], slow: threading.Event):
    @workflow(name=name)
    async def wf(ctx, n):
        for i in range(n):
            await ctx.step(f"s{i}", _where, log, slow)

    return wf


async def test_a_quick_sync_step_runs_inline_and_a_slow_one_goes_back_to_threads(engine, roomy_timing):
    """A sync step function runs in a thread until it has been quick QUICK_RUNS times, then inline (no
    thread hop per step); one slow inline run sends it back to threads for good."""
    log: list[str] = []
    slow = threading.Event()
    wf = _where_loop("steps-inline", log, slow)
    quick = step_calls.QUICK_RUNS
    assert (await engine.run(wf, quick + 2, run_id="inline-1")).status == "succeeded"
    assert log == ["thread"] * quick + ["loop"] * 2
    slow.set()
    log.clear()
    assert (await engine.run(wf, 1, run_id="inline-2")).status == "succeeded"
    slow.clear()
    assert (await engine.run(wf, 2, run_id="inline-3")).status == "succeeded"
    assert log == ["loop", "thread", "thread"], "demoted after one slow inline run"


def _record_commits(store, monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, str]]]:
    """Every commit's records, as (op id, status), in commit order."""
    commits: list[list[tuple[str, str]]] = []
    real_commit = store.commit

    async def recording_commit(run_id, fence, commit):
        commits.append([(r.op_id, r.status) for r in commit.records])
        return await real_commit(run_id, fence, commit)

    monkeypatch.setattr(store, "commit", recording_commit)
    return commits


async def test_a_quick_inline_step_commits_its_start_with_its_outcome(engine, store, monkeypatch, roomy_timing):
    """Steps that run in a thread commit their start, then their outcome; once a sync function runs
    inline, both records go in one commit (nothing could observe the start in between). The journal
    keeps both records either way."""
    commits = _record_commits(store, monkeypatch)
    log: list[str] = []
    wf = _where_loop("steps-inline-commits", log, threading.Event())
    quick = step_calls.QUICK_RUNS
    run_id = "inline-commits"
    assert (await engine.run(wf, quick + 2, run_id=run_id)).status == "succeeded"
    assert log == ["thread"] * quick + ["loop"] * 2
    step_commits = [c for c in commits if any(op.startswith("s") for op, _ in c)]
    threaded = [[(f"s{i}", "started")] for i in range(quick)]
    assert step_commits[: 2 * quick : 2] == threaded
    assert step_commits[2 * quick:] == [[(f"s{i}", "started"), (f"s{i}", "completed")] for i in (quick, quick + 1)]
    history = [(r.op_id, r.status) for r in await engine.history(run_id) if r.op_id.startswith("s")]
    assert history == [(f"s{i}", st) for i in range(quick + 2) for st in ("started", "completed")]


def _tick(counter: list[int], reached: threading.Event) -> int:
    counter[0] += 1
    if counter[0] == 50:
        reached.set()
    return counter[0]


async def test_inline_sync_steps_still_let_the_loop_run_so_cancel_gets_through(engine):
    counter = [0]
    total = 200_000
    reached = threading.Event()

    @workflow(name="steps-inline-cancel")
    async def wf(ctx):
        for i in range(total):
            await ctx.step(f"t{i}", _tick, counter, reached)

    run_id = await engine.start(wf, run_id="inline-cancel")
    # This test task only gets a turn if the inline steps let the loop run.
    assert await asyncio.to_thread(reached.wait, 60)
    st = await engine.cancel(run_id, "stop")
    assert st.status == "cancelled"
    assert counter[0] < total, "cancelled part-way, not after every step ran"


# ---------------------------------------------------------------------------------------------- async steps at one commit


async def test_an_async_step_that_never_suspends_commits_its_start_with_its_outcome(engine, store, monkeypatch):
    """An async step function whose coroutine completes without suspending takes one commit, as a quick sync
    step does; one that suspends has its start committed before it goes on, then its outcome. Failures
    and retries keep their records. The journal keeps every record either way."""
    commits = _record_commits(store, monkeypatch)
    seen_on_resuming: list[list[list[tuple[str, str]]]] = []
    failures = [1]

    async def at_once(i: int) -> int:
        return i

    async def suspends(i: int) -> int:
        await asyncio.sleep(0)
        seen_on_resuming.append(list(commits))
        return i

    async def fails_once_at_once() -> str:
        if failures:
            failures.pop()
            raise RuntimeError("first attempt fails")
        return "ok"

    @workflow(name="steps-async-commits")
    async def wf(ctx):
        a = await ctx.step("a", at_once, 1)
        b = await ctx.step("b", suspends, 2)
        c = await ctx.step("c", fails_once_at_once, retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=False))
        return [a, b, c]

    st = await engine.run(wf, run_id="async-commits")
    assert st.status == "succeeded", st.error
    assert st.result == [1, 2, "ok"]
    step_commits = [c for c in commits if any(op in ("a", "b", "c") for op, _ in c)]
    assert step_commits == [
        [("a", "started"), ("a", "completed")],
        [("b", "started")],
        [("b", "completed")],
        [("c", "started"), ("c", "failed")],
        [("c", "started"), ("c", "completed")],
    ]
    assert seen_on_resuming[0][-1] == [("b", "started")], "b's start was committed before b went on"
    history = [(r.op_id, r.status, r.attempt) for r in await engine.history("async-commits")]
    assert history == [("a", "started", 1), ("a", "completed", 1), ("b", "started", 1), ("b", "completed", 1),
                       ("c", "started", 1), ("c", "failed", 1), ("c", "started", 2), ("c", "completed", 2)]


async def test_an_async_step_whose_start_a_cancel_refuses_never_goes_on(engine, db_path):
    """The start of a suspended async step is committed with the cancel check: refused (a cancel another process
    requested while the coroutine ran its first stretch), the coroutine is closed where it waits (its finally
    runs) and what follows its await never runs."""
    events: list[str] = []

    async def suspends() -> None:
        con = sqlite3.connect(db_path)  # another process's cancel, in the store while the step runs
        with con:
            con.execute("UPDATE runs SET cancel_requested='stop' WHERE run_id='async-cancel-start'")
        con.close()
        try:
            await asyncio.sleep(0)
            events.append("went on")
        finally:
            events.append("closed")

    @workflow(name="steps-async-cancel-start")
    async def wf(ctx):
        await ctx.step("s", suspends)

    st = await engine.run(wf, run_id="async-cancel-start")
    assert st.status == "cancelled", st.error
    assert st.error["message"] == "stop"
    assert events == ["closed"]
    assert [(r.op_id, r.status) for r in await engine.history("async-cancel-start")] == [("s", "started")]
