"""The run driver (engine/driver.py): one meaning of spec.timeoutSeconds and spec.retry for `dsb run`,
`dsb resume`, `dsb worker` and the operator's turn.

The deadline counts from the run's creation across every attempt and wait; a failed run is retried with
backoff while attempts are left, never after the deadline. Time is moved by the ``clock`` fixture, so no test
sleeps through a backoff or a deadline (the one exception is the deadline of an execution in progress, a
timer of the event loop: 0.3 s)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

import durable_sandbox as ds
from durable_sandbox.engine import Engine, RunRecord, RunStatus
from durable_sandbox.engine.driver import POLICY_LABEL, LocalDriver, RetrySchedule, RunPolicy, Step, decide

RETRY = RetrySchedule(max_attempts=3, initial_interval=10.0, backoff=2.0, max_interval=60.0)


def record(status: RunStatus = RunStatus.PENDING, **changes: object) -> RunRecord:
    return replace(RunRecord(run_id="r", workflow="w", status=status, created_at=1000.0, updated_at=1000.0),
                   **changes)  # type: ignore[arg-type]


# ------------------------------------------------------------------ decide: the policy, judged alone


@pytest.mark.parametrize(("run", "policy", "now", "expected"), [
    (record(RunStatus.SUCCEEDED), RunPolicy(timeout=5), 2000.0, Step("finished")),
    (record(RunStatus.CANCELLED), RunPolicy(), 1000.0, Step("finished")),
    (record(RunStatus.FAILED), RunPolicy(), 1000.0, Step("finished")),  # one attempt, no retry
    # a retry waits for its backoff (interval of attempt 2: 10 s after the failure), then executes
    (record(RunStatus.FAILED, updated_at=1001.0), RunPolicy(retry=RETRY), 1002.0, Step("backoff", at=1011.0)),
    (record(RunStatus.FAILED, updated_at=1001.0), RunPolicy(retry=RETRY), 1011.0, Step("execute")),
    (record(RunStatus.FAILED, epoch=1, updated_at=1001.0), RunPolicy(retry=RETRY), 1002.0, Step("backoff", at=1021.0)),
    (record(RunStatus.FAILED, epoch=2), RunPolicy(retry=RETRY), 5000.0, Step("finished")),  # 3 of 3 attempts
    (record(RunStatus.FAILED, cancel_requested="x"), RunPolicy(retry=RETRY), 5000.0, Step("finished")),
    # the deadline comes first: the backoff ends at it, and then no attempt starts
    (record(RunStatus.FAILED, updated_at=1001.0), RunPolicy(timeout=5, retry=RETRY), 1002.0, Step("backoff", at=1005.0)),
    (record(RunStatus.FAILED, updated_at=1001.0), RunPolicy(timeout=5, retry=RETRY), 1005.0, Step("timeout")),
    (record(), RunPolicy(timeout=5), 1004.0, Step("execute", deadline=1005.0)),
    (record(RunStatus.RUNNING), RunPolicy(timeout=5), 1005.0, Step("timeout")),
    (record(RunStatus.RUNNING, cancel_requested="timed out"), RunPolicy(timeout=5), 1006.0,
     Step("execute", deadline=1005.0)),  # the cancel is carried out by executing it
    # a wait lasts until the timer or the deadline, whichever is first; a signal ends it any time
    (record(RunStatus.WAITING, wake_at=1100.0), RunPolicy(timeout=50), 1001.0, Step("wait", at=1050.0, deadline=1050.0)),
    (record(RunStatus.WAITING, wake_at=1100.0), RunPolicy(), 1001.0, Step("wait", at=1100.0)),
    (record(RunStatus.WAITING), RunPolicy(), 1001.0, Step("wait")),
    (record(RunStatus.WAITING, wake_at=1100.0), RunPolicy(), 1100.0, Step("execute")),
    (record(RunStatus.WAITING), RunPolicy(timeout=50), 1050.0, Step("timeout")),
    (record(RunStatus.SUSPENDED), RunPolicy(), 1001.0, Step("resume")),
])
def test_the_next_step_of_a_run(run: RunRecord, policy: RunPolicy, now: float, expected: Step) -> None:
    assert decide(run, policy, now) == expected


def test_suspend_and_a_manual_retry() -> None:
    assert decide(record(), RunPolicy(), 1001.0, suspend=True) == Step("suspend")
    assert decide(record(RunStatus.SUSPENDED), RunPolicy(), 1001.0, suspend=True) == Step("suspended")
    assert decide(record(RunStatus.SUSPENDED), RunPolicy(timeout=1), 1001.0, suspend=True) == Step("timeout")
    exhausted = record(RunStatus.FAILED, epoch=2)
    assert decide(exhausted, RunPolicy(retry=RETRY), 5000.0, manual=True) == Step("execute")
    assert decide(exhausted, RunPolicy(), 1001.0, manual=True) == Step("execute"), "dsb resume retries a failed run"
    assert decide(exhausted, RunPolicy(timeout=5), 1005.0, manual=True) == Step("timeout"), "never after the deadline"


def test_the_policy_travels_in_the_runs_labels() -> None:
    policy = RunPolicy(timeout=30, retry=RETRY)
    labels = policy.to_labels()
    assert list(labels) == [POLICY_LABEL]
    assert RunPolicy.from_labels({"other": "x", **labels}) == policy
    assert RunPolicy().to_labels() == {} and RunPolicy.from_labels({}) == RunPolicy()
    assert RunPolicy(timeout=2.5).timeout_reason == "timed out after 2.5s (spec.timeoutSeconds)"


# ------------------------------------------------------------------ the local driver and the worker, on a real store

ATTEMPTS: dict[str, int] = {}


@ds.workflow(name="driver-fails-once")
async def fails_once(ctx: ds.Context, key: str) -> dict[str, int]:
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] == 1:
        raise RuntimeError("first attempt fails")
    return {"attempts": ATTEMPTS[key]}


@ds.workflow(name="driver-always-fails")
async def always_fails(ctx: ds.Context, key: str) -> None:
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    raise RuntimeError(f"attempt {ATTEMPTS[key]} fails")


@ds.workflow(name="driver-blocks")
async def blocks(ctx: ds.Context, key: str) -> None:
    await ctx.step("forever", asyncio.Event().wait)


@ds.workflow(name="driver-waits")
async def waits(ctx: ds.Context, key: str) -> object:
    return await ctx.callback("approve")


def moving(clock: Any) -> Callable[[float], Awaitable[None]]:
    """A backoff's sleep that moves the clock (the ``clock`` fixture) instead of waiting."""

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)  # the backoff passes at once
        await asyncio.sleep(0)

    return sleep


async def test_a_retry_after_its_backoff_succeeds(engine: Engine, clock: Any) -> None:
    policy = RunPolicy(retry=RetrySchedule(max_attempts=2, initial_interval=30))
    run = await engine.create(fails_once, "a", run_id="retried", labels=policy.to_labels())
    retries: list[tuple[int, float]] = []
    driver = LocalDriver(engine, sleep=moving(clock), on_retry=lambda r, attempt, delay: retries.append((attempt, delay)))
    state = await driver.drive(run.run_id, policy)
    assert (state.status, state.attempt, state.result) == ("succeeded", 2, {"attempts": 2})
    assert len(retries) == 1 and retries[0][0] == 2 and 29 <= retries[0][1] <= 30


async def test_the_deadline_counts_across_attempts_and_backoffs(engine: Engine, clock: Any) -> None:
    """Attempt 1 fails at once; the next is due 30 s later, past the 10 s deadline: it never starts, and the
    run ends cancelled for its deadline (under a per-attempt timer it would have had a second attempt)."""
    policy = RunPolicy(timeout=10, retry=RetrySchedule(max_attempts=3, initial_interval=30))
    run = await engine.create(always_fails, "b", run_id="late")
    state = await LocalDriver(engine, sleep=moving(clock)).drive(run.run_id, policy)
    assert (state.status, state.attempt, ATTEMPTS["b"]) == ("cancelled", 1, 1)
    assert state.error is not None and state.error["message"] == "timed out after 10s (spec.timeoutSeconds)"


async def test_an_execution_is_cancelled_at_the_deadline(engine: Engine) -> None:
    policy = RunPolicy(timeout=0.3)
    run = await engine.create(blocks, "c", run_id="blocked")
    state = await asyncio.wait_for(LocalDriver(engine).drive(run.run_id, policy), 30)
    assert state.status == "cancelled" and state.error is not None
    assert state.error["message"] == "timed out after 0.3s (spec.timeoutSeconds)"


async def test_a_resume_is_one_more_attempt_but_never_past_the_deadline(engine: Engine, clock: Any) -> None:
    run = await engine.create(always_fails, "d", run_id="resumed")
    driver = LocalDriver(engine, sleep=moving(clock))
    assert (await driver.drive(run.run_id, RunPolicy(), manual=False)).attempt == 1  # one attempt, no retry
    again = await driver.drive(run.run_id, RunPolicy())  # `dsb resume`: manual
    assert (again.status, again.attempt, ATTEMPTS["d"]) == ("failed", 2, 2)
    clock.advance(100)
    late = await driver.drive(run.run_id, RunPolicy(timeout=50))
    assert (late.status, late.attempt, ATTEMPTS["d"]) == ("cancelled", 2, 2)


async def test_a_worker_retries_and_times_out_by_the_policies_recorded_with_the_runs(
        engine: Engine, clock: Any) -> None:
    retry = RunPolicy(retry=RetrySchedule(max_attempts=2, initial_interval=30))
    flaky = await engine.create(fails_once, "e", run_id="flaky", labels=retry.to_labels())
    assert (await engine.resume(flaky.run_id)).status == "failed"
    waiting = await engine.create(waits, "f", run_id="waiting", labels=RunPolicy(timeout=60).to_labels())
    assert (await engine.resume(waiting.run_id)).status == "waiting"
    await engine.worker(idle_exit=True, poll_interval=0.01)
    assert (await engine.inspect("flaky")).status == "failed", "its backoff is not over"
    assert (await engine.inspect("waiting")).status == "waiting", "its deadline has not passed"
    clock.advance(61)
    await engine.worker(idle_exit=True, poll_interval=0.01)
    done, expired = await engine.inspect("flaky"), await engine.inspect("waiting")
    assert (done.status, done.attempt, done.result) == ("succeeded", 2, {"attempts": 2})
    assert expired.status == "cancelled" and expired.error is not None
    assert expired.error["message"] == "timed out after 60s (spec.timeoutSeconds)"
