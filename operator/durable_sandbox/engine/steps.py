"""A step's durable protocol, in the order its records are written: replay (a completed step returns its
recorded result without running), the cache, the start record, the attempt, a retry after its backoff, the
outcome record, and the fault points between them (``before:``, ``inside:``, ``after:<op id>``).

This is the engine's hot path (every ``ctx.step`` of every run; docs/benchmarks.md measures its cost per step
against peers): how the function itself is called is engine/step_calls.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import SerializationError, StepFailed, Suspend
from durable_sandbox.engine.policies import NO_RETRY, RetryPolicy
from durable_sandbox.engine.records import ErrorInfo, OperationRecord, OpKind, OpStatus
from durable_sandbox.engine.serialization import callable_name, input_digest, revalidate, to_jsonable
from durable_sandbox.engine.step_calls import invoke, invoke_async, is_async, judged_code, runs_inline

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime

STEP = OpKind.STEP.value
COMPLETED = OpStatus.COMPLETED.value
FAILED = OpStatus.FAILED.value
STARTED = OpStatus.STARTED.value


class StepRecords:
    """The records of one step (its id, function name and input digest) in the run's journal."""

    __slots__ = ("digest", "name", "op_id", "rt")

    def __init__(self, rt: RunRuntime, op_id: str, name: str, digest: str | None) -> None:
        self.rt = rt
        self.op_id = op_id
        self.name = name
        self.digest = digest

    def record(self, status: str, attempt: int, result: Any = None, *, error: ErrorInfo | None = None,
               meta: dict[str, Any] | None = None) -> OperationRecord:
        return OperationRecord(self.op_id, STEP, self.name, status, attempt, self.digest, result, error=error,
                               meta=meta, epoch=self.rt.epoch)

    async def failed(self, attempt: int, info: ErrorInfo, *, next_attempt_at: float | None = None) -> None:
        meta = None if next_attempt_at is None else {"nextAttemptAt": next_attempt_at}
        await self.rt.write(self.record(FAILED, attempt, error=info, meta=meta))


async def run_step(
    rt: RunRuntime,
    op_id: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    cache_key: str | None = None,
    cache_ttl: float | None = None,
    check_input: bool = True,
) -> Any:
    """``ctx.step``: the recorded result of a completed step, a cached value, or the function's, recorded."""
    name = callable_name(fn)
    digest = input_digest(args, kwargs) if check_input else None
    prev = rt.enter(op_id, STEP, name, digest)
    attempt = 1
    if prev is not None:
        if prev.status == COMPLETED:
            return revalidate(fn, prev.result)
        attempt, resume_at = rt.next_attempt(prev)
        if resume_at is None:
            raise rt.recorded_failure(prev)
        if resume_at > time.time():  # a retry backoff that a restart interrupted: wait what is left
            await asyncio.sleep(resume_at - time.time())
    records = StepRecords(rt, op_id, name, digest)
    if cache_key is not None and (hit := await _record_cache_hit(records, attempt, cache_key)):
        return revalidate(fn, hit[0])
    return await _attempts(records, fn, args, kwargs, retry or NO_RETRY, timeout, attempt, cache_key, cache_ttl)


async def _record_cache_hit(records: StepRecords, attempt: int, cache_key: str) -> tuple[Any] | None:
    """A step's cached value, if its cache key has one: recorded as the step's outcome (a hit), in a 1-tuple
    (a cached value may be None); None on a miss."""
    hit = await records.rt.store.cache_get(cache_key, time.time())
    if hit is None:
        return None
    value, created = hit
    await records.rt.write(records.record(COMPLETED, attempt, value,
                                          meta={"cache": "hit", "cacheKey": cache_key, "cachedAt": created}))
    return (value,)


async def _attempts(records: StepRecords, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    policy: RetryPolicy, timeout: float | None, attempt: int, cache_key: str | None,
                    cache_ttl: float | None) -> Any:
    """Attempt after attempt until one returns (its outcome recorded) or the policy gives up (StepFailed)."""
    rt = records.rt
    op_id = records.op_id
    code = judged_code(fn, timeout)
    asynchronous = is_async(fn)
    while True:
        faults.reach(f"before:{op_id}")
        started = records.record(STARTED, attempt)
        # A step that will run inline (a sync function known to be quick, or an async one's coroutine up
        # to its first suspension) holds the loop meanwhile, so no one in this process could see its
        # start in between: its start is committed in one commit with its outcome, which halves the
        # commits of a loop of quick steps (an async function that suspends gets its start committed
        # first, then goes on). What that gives up: a crash inside such a step leaves no start record,
        # so it re-runs as the same attempt; a cancel is refused at that outcome's commit.
        inline = runs_inline(code)
        deferred_start = inline or asynchronous
        if deferred_start:
            rt.defer(started)
        else:
            await rt.write(started, check_cancel=True)
        faults.reach(f"inside:{op_id}")
        rt.active_begin()
        try:
            if asynchronous:
                value, deferred_start = await invoke_async(fn, args, kwargs, timeout, op_id, rt)
            else:
                value = await invoke(fn, args, kwargs, timeout, op_id, rt, code=code, inline=inline)
        except (Suspend, asyncio.CancelledError):
            raise
        except Exception as exc:
            await asyncio.sleep(await _failed_attempt(records, policy, exc, attempt))
            attempt += 1
            continue
        finally:
            rt.active_end()
        return await _record_outcome(records, value, attempt, cache_key, cache_ttl, deferred_start)


async def _failed_attempt(records: StepRecords, policy: RetryPolicy, exc: Exception, attempt: int) -> float:
    """Record a failed attempt: the delay before the next one if the policy retries it, else StepFailed."""
    info = ErrorInfo.from_exception(exc)
    if policy.should_retry(exc, attempt):
        delay = policy.delay(attempt)
        await records.failed(attempt, info, next_attempt_at=time.time() + delay)
        return delay
    await records.failed(attempt, info)
    raise StepFailed(records.op_id, info.type, info.message, attempt, info.retryable) from exc


async def _record_outcome(records: StepRecords, value: Any, attempt: int, cache_key: str | None,
                          cache_ttl: float | None, deferred_start: bool) -> Any:
    """Commit the step's value as its outcome (and to the cache), at a step boundary; ``value`` back."""
    rt = records.rt
    op_id = records.op_id
    try:
        result = to_jsonable(value, what=f"The result of step {op_id!r}")
    except SerializationError as exc:
        # Not retryable: the same code returns the same kind of value again. Raised as
        # StepFailed, exactly as a replay of this record will raise it.
        info = ErrorInfo.from_exception(exc, retryable=False)
        await records.failed(attempt, info)
        raise StepFailed(op_id, info.type, info.message, attempt, False) from exc
    cache = None
    if cache_key is not None:
        cache = (cache_key, result, None if cache_ttl is None else time.time() + cache_ttl)
    await rt.write(
        records.record(COMPLETED, attempt, result,
                       meta={"cache": "miss", "cacheKey": cache_key} if cache_key is not None else None),
        cache=cache,
        boundary=True,
        check_cancel=deferred_start,
    )
    faults.reach(f"after:{op_id}")
    return value
