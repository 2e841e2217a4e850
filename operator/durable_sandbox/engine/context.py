"""The workflow context: ``ctx.step``, ``ctx.parallel``, ``ctx.callback``, ``ctx.sleep``, ``ctx.patched``,
``ctx.progress``, ``ctx.state`` and the ``ctx.sandbox`` extension point.

Operations are matched to the journal by explicit id, never by call order, so concurrent branches
replay correctly whatever order they finish in. A completed operation returns its recorded result
without running; a started-but-unfinished one runs again with the same id (at-least-once).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from durable_sandbox.engine import faults
from durable_sandbox.engine.children import ChildWorkflows
from durable_sandbox.engine.continue_as_new import ContinuesAsNew
from durable_sandbox.engine.coroutines import Rest, first_stretch
from durable_sandbox.engine.errors import (
    CallbackTimeout,
    DuplicateOperationError,
    ParallelError,
    SerializationError,
    StepFailed,
    StepTimeout,
    Suspend,
)
from durable_sandbox.engine.policies import NO_RETRY, RetryPolicy
from durable_sandbox.engine.records import ErrorInfo, OperationRecord, OpKind, OpStatus
from durable_sandbox.engine.serialization import (
    callable_name,
    input_digest,
    revalidate,
    to_jsonable,
    value_digest,
)
from durable_sandbox.engine.step_threads import run_abandonable
from durable_sandbox.engine.traced import traced_callback, traced_step

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime

T = TypeVar("T")

COMPLETED = OpStatus.COMPLETED.value
FAILED = OpStatus.FAILED.value
STARTED = OpStatus.STARTED.value


def _takes_context(fn: Callable[..., Any]) -> bool:
    """A parallel branch that takes one parameter named ``ctx`` (or annotated Context) gets a child context."""
    target = fn.func if isinstance(fn, partial) else fn
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    if len(params) != 1:
        return False
    ann = params[0].annotation
    return params[0].name == "ctx" or ann is Context or ann == "Context" or (
        isinstance(ann, str) and ann.endswith(".Context")
    ) or getattr(target, "__durable_branch__", False)


# Sync step functions: a thread hop costs more than a whole no-op step, and most steps are short glue.
# A sync function runs inline on the loop once it has shown it is quick: after QUICK_RUNS thread runs
# that took under QUICK_SECONDS (slower runs do not count; a preempted thread can look slow). One inline
# run that takes longer than SLOW_SECONDS sends it back to threads for good (for the life of the process).
# Functions with a timeout always run in a thread of their own (a timeout must be able to abandon them:
# engine/step_threads.py), and callables without code never run inline (no identity to judge by).
# Why this is safe: a quick function serialised with its parallel siblings costs nothing; a long one
# runs in a thread, so it cannot stall lease renewal, signals or other runs. What remains: a function
# that was quick and suddenly blocks stalls the loop that once (then it is demoted); the lease then
# renews late, and fencing keeps a worker that lost its lease from writing (at-least-once, as always).
QUICK_RUNS = 3
QUICK_SECONDS = 0.001
SLOW_SECONDS = 0.02
YIELD_EVERY = 0.005  # inline work lets the loop run (lease renewal, signals, cancel) at least this often
_observed: dict[Any, int] = {}  # code object -> quick thread runs seen (-1: demoted)
_DEMOTED = -1


def _code_of(fn: Callable[..., Any]) -> Any:
    target = fn
    while isinstance(target, partial):
        target = target.func
    return getattr(target, "__code__", None)


def _judged_code(fn: Callable[..., Any], timeout: float | None) -> Any:
    """The code object by which ``fn``'s quickness is judged; None when it must never run inline."""
    return _code_of(fn) if timeout is None else None


def _runs_inline(code: Any) -> bool:
    return code is not None and _observed.get(code, 0) >= QUICK_RUNS


def _is_async(fn: Callable[..., Any]) -> bool:
    code = _code_of(fn)
    if code is not None:  # a function or a partial of one: its code says (the cheap test, on every step)
        return bool(code.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "func", None))


async def _invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None,
                  op_id: str, rt: RunRuntime, *, code: Any, inline: bool) -> Any:
    """A sync step function: inline once it has been quick, else in a thread (see above)."""
    if inline and code is not None:
        # A sync function known to be quick (only sync functions are ever counted): inline.
        started = time.perf_counter()
        if started - rt.last_yield >= YIELD_EVERY:
            await rt.let_loop_run()
            started = time.perf_counter()
        result = fn(*args, **kwargs)
        if time.perf_counter() - started > SLOW_SECONDS:
            _observed[code] = _DEMOTED
        if inspect.isawaitable(result):
            result = await result
        return result
    if timeout is None:
        # In a thread, so that parallel branches really run in parallel and a blocking call cannot stall
        # the lease renewal; timed, to learn whether it is quick.
        result = await asyncio.to_thread(_timed, fn, args, kwargs, code)
    else:
        # A thread that nothing waits for: at the timeout the step fails and the run moves on, while the
        # function (which no one can stop) runs on; its late result is dropped (engine/step_threads.py).
        try:
            result = await asyncio.wait_for(run_abandonable(fn, args, kwargs, name=op_id), timeout)
        except TimeoutError:
            raise StepTimeout(op_id, timeout) from None
    if inspect.isawaitable(result):  # a sync callable that returned a coroutine (e.g. a lambda over an async fn)
        result = await result
    return result


async def _invoke_async(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                        timeout: float | None, op_id: str, rt: RunRuntime) -> tuple[Any, bool]:
    """An async step function, whose start record the caller has deferred. Without a timeout its coroutine
    runs at once up to its first suspension (engine/coroutines.py): one that completes there returns with its
    start still deferred (it rides on the outcome's commit, one commit per step, as a quick sync step's does);
    one that suspends has its start committed (a cancel refused there) before it goes on, in this same task.
    With a timeout the whole function runs in the task ``asyncio.wait_for`` makes, after its start is
    committed (its first stretch must not run in another task than the rest: ``asyncio.timeout``,
    ``TaskGroup`` bind to the task they start in). Returns ``(value, whether the start is still deferred)``."""
    if time.perf_counter() - rt.last_yield >= YIELD_EVERY:
        await rt.let_loop_run()  # a loop of steps that never suspend must still let the loop run
    if timeout is not None:
        await rt.write(check_cancel=True)
        try:
            return await asyncio.wait_for(fn(*args, **kwargs), timeout), False
        except TimeoutError:
            raise StepTimeout(op_id, timeout) from None
    coro = fn(*args, **kwargs)
    if not isinstance(coro, Coroutine):  # an awaitable of another kind: awaited as it is, its start first
        await rt.write(check_cancel=True)
        return await coro, False
    done, outcome = first_stretch(coro)
    if done:
        return outcome, True
    try:
        await rt.write(check_cancel=True)
    except BaseException:
        coro.close()  # never to go on: its finally blocks run now
        raise
    return await Rest(coro, outcome), False


def _timed(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], code: Any) -> Any:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    if code is not None and time.perf_counter() - started < QUICK_SECONDS:
        runs = _observed.get(code, 0)
        if runs != _DEMOTED:
            _observed[code] = runs + 1
    return result



async def _record_cache_hit(rt: RunRuntime, op_id: str, name: str, attempt: int, digest: str | None,
                            cache_key: str) -> tuple[Any] | None:
    """A step's cached value, if its cache key has one: recorded as the step's outcome (a hit), in a 1-tuple
    (a cached value may be None); None on a miss."""
    hit = await rt.store.cache_get(cache_key, time.time())
    if hit is None:
        return None
    value, created = hit
    await rt.write(OperationRecord(op_id, OpKind.STEP.value, name, COMPLETED, attempt, digest, value,
                                   meta={"cache": "hit", "cacheKey": cache_key, "cachedAt": created}, epoch=rt.epoch))
    return (value,)

class Context(ChildWorkflows, ContinuesAsNew):
    """What a workflow function receives. One per run, plus a child per parallel branch (scoped ids).
    ``child_workflow``/``start_child`` come from engine/children.py, ``continue_as_new`` from engine/continue_as_new.py."""

    __slots__ = ("_rt", "_scope")

    def __init__(self, runtime: RunRuntime, scope: str = "") -> None:
        self._rt = runtime
        self._scope = scope

    # ------------------------------------------------------------------ identity

    @property
    def run_id(self) -> str:
        return self._rt.run_id

    @property
    def workflow(self) -> str:
        return self._rt.workflow

    @property
    def scope(self) -> str:
        return self._scope

    @property
    def operations(self) -> RunRuntime:
        """The run's operation journal, for extensions such as sandbox sessions."""
        return self._rt

    def child(self, scope: str) -> Context:
        return Context(self._rt, self._scope + scope.rstrip("/") + "/")

    # ------------------------------------------------------------------ step

    # Longer than the ~80 lines a function gets here, on purpose: this is the engine's hot path (every
    # ctx.step of every run; docs/benchmarks.md measures its cost per step against peers), and it reads top to
    # bottom as the step's durability rules: replay, cache, start record, attempt, retry, outcome record.
    # Long on purpose: a step's durable protocol (replay, cache, start record, retry, outcome record, the
    # fault points between them) reads in one place, top to bottom, in the order its records are written.
    @traced_step
    async def step(
        self,
        id: str,
        fn: Callable[..., T] | Callable[..., Awaitable[T]],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        cache_key: str | None = None,
        cache_ttl: float | None = None,
        check_input: bool = True,
        **kwargs: Any,
    ) -> T:
        rt = self._rt
        op_id = self._scope + id
        name = callable_name(fn)
        digest = input_digest(args, kwargs) if check_input else None
        prev = rt.enter(op_id, OpKind.STEP.value, name, digest)
        attempt = 1
        if prev is not None:
            if prev.status == COMPLETED:
                return revalidate(fn, prev.result)
            attempt, resume_at = rt.next_attempt(prev)
            if resume_at is None:
                raise rt.recorded_failure(prev)
            if resume_at > time.time():  # a retry backoff that a restart interrupted: wait what is left
                await asyncio.sleep(resume_at - time.time())
        policy = retry or NO_RETRY

        if cache_key is not None and (hit := await _record_cache_hit(rt, op_id, name, attempt, digest, cache_key)):
            return revalidate(fn, hit[0])

        code = _judged_code(fn, timeout)
        is_async = _is_async(fn)
        while True:
            faults.reach(f"before:{op_id}")
            started = OperationRecord(op_id, OpKind.STEP.value, name, STARTED, attempt, digest, epoch=rt.epoch)
            # A step that will run inline (a sync function known to be quick, or an async one's coroutine up
            # to its first suspension) holds the loop meanwhile, so no one in this process could see its
            # start in between: its start is committed in one commit with its outcome, which halves the
            # commits of a loop of quick steps (an async function that suspends gets its start committed
            # first, then goes on). What that gives up: a crash inside such a step leaves no start record,
            # so it re-runs as the same attempt; a cancel is refused at that outcome's commit.
            inline = _runs_inline(code)
            deferred_start = inline or is_async
            if deferred_start:
                rt.defer(started)
            else:
                await rt.write(started, check_cancel=True)
            faults.reach(f"inside:{op_id}")
            rt.active_begin()
            try:
                if is_async:
                    value, deferred_start = await _invoke_async(fn, args, kwargs, timeout, op_id, rt)
                else:
                    value = await _invoke(fn, args, kwargs, timeout, op_id, rt, code=code, inline=inline)
            except (Suspend, asyncio.CancelledError):
                raise
            except Exception as exc:
                info = ErrorInfo.from_exception(exc)
                if policy.should_retry(exc, attempt):
                    delay = policy.delay(attempt)
                    await rt.write(
                        OperationRecord(
                            op_id, OpKind.STEP.value, name, FAILED, attempt, digest, error=info,
                            meta={"nextAttemptAt": time.time() + delay}, epoch=rt.epoch,
                        )
                    )
                    await asyncio.sleep(delay)
                    attempt += 1
                    continue
                await rt.write(
                    OperationRecord(op_id, OpKind.STEP.value, name, FAILED, attempt, digest, error=info, epoch=rt.epoch)
                )
                raise StepFailed(op_id, info.type, info.message, attempt, info.retryable) from exc
            finally:
                rt.active_end()
            try:
                result = to_jsonable(value, what=f"The result of step {op_id!r}")
            except SerializationError as exc:
                # Not retryable: the same code returns the same kind of value again. Raised as
                # StepFailed, exactly as a replay of this record will raise it.
                info = ErrorInfo.from_exception(exc, retryable=False)
                await rt.write(
                    OperationRecord(op_id, OpKind.STEP.value, name, FAILED, attempt, digest, error=info, epoch=rt.epoch)
                )
                raise StepFailed(op_id, info.type, info.message, attempt, False) from exc
            cache = None
            if cache_key is not None:
                cache = (cache_key, result, None if cache_ttl is None else time.time() + cache_ttl)
            await rt.write(
                OperationRecord(
                    op_id, OpKind.STEP.value, name, COMPLETED, attempt, digest, result,
                    meta={"cache": "miss", "cacheKey": cache_key} if cache_key is not None else None,
                    epoch=rt.epoch,
                ),
                cache=cache,
                boundary=True,
                check_cancel=deferred_start,
            )
            faults.reach(f"after:{op_id}")
            return value

    # ------------------------------------------------------------------ parallel

    # Long on purpose: the fan-out's replay, its concurrency bound and the join's one commit are one
    # protocol; split, the order of its records would be spread over helpers.
    async def parallel(
        self,
        id: str,
        branches: Mapping[str, Callable[..., Any]] | Sequence[Callable[..., Any]],
        *,
        max_concurrency: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Run branches concurrently, each checkpointed on its own under ``id/<key>``.

        A branch is a plain callable (run as one step) or ``async def branch(ctx)`` with its own scoped
        steps and callbacks. After a partial failure only unfinished branches run again; the error
        (:class:`ParallelError`) names each failed key. Returns a list or dict matching ``branches``.
        """
        rt = self._rt
        op_id = self._scope + id
        as_list = not isinstance(branches, Mapping)
        items: list[tuple[str, Callable[..., Any]]] = (
            [(str(k), b) for k, b in branches.items()]
            if isinstance(branches, Mapping)
            else [(str(i), b) for i, b in enumerate(branches)]
        )
        for key, _ in items:
            if not key or "/" in key:
                raise ValueError(f"Parallel {op_id!r}: branch key {key!r} must be non-empty and contain no '/'.")
        keys = [k for k, _ in items]
        prev = rt.enter(op_id, OpKind.PARALLEL.value, id, value_digest(keys))
        if prev is not None and prev.status == COMPLETED:
            return _revalidate_branches(items, prev.result, as_list)
        if prev is None:
            await rt.write(
                OperationRecord(op_id, OpKind.PARALLEL.value, id, STARTED, 1, value_digest(keys), meta={"branches": keys}, epoch=rt.epoch),
                check_cancel=True,
            )
        gate: Any = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def run_branch(key: str, branch: Callable[..., Any]) -> Any:
            async with gate if gate is not None else nullcontext():
                if not _takes_context(branch):
                    return await self.step(f"{id}/{key}", branch, retry=retry, timeout=timeout)
                bop = f"{op_id}/{key}"
                bname = callable_name(branch)
                done = rt.enter(bop, OpKind.STEP.value, bname, None)
                if done is not None and done.status == COMPLETED:
                    return revalidate(branch, done.result)
                value = await branch(Context(rt, bop + "/"))
                await rt.write(
                    OperationRecord(
                        bop, OpKind.STEP.value, bname, COMPLETED, 1, None,
                        to_jsonable(value, what=f"The result of branch {bop!r}"), meta={"branch": True}, epoch=rt.epoch,
                    ),
                    boundary=True,
                )
                return value

        outcomes = await asyncio.gather(*(run_branch(k, b) for k, b in items), return_exceptions=True)
        failures: dict[str, Exception] = {}
        waiting: list[Suspend] = []
        for (key, _), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Suspend):
                waiting.append(outcome)
            elif isinstance(outcome, Exception):
                failures[key] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
        if failures:
            raise ParallelError(op_id, failures)
        if waiting:
            raise Suspend(
                [i for s in waiting for i in s.op_ids],
                min((s.wake_at for s in waiting if s.wake_at is not None), default=None),
            )
        values = [o for o in outcomes]
        result: Any = values if as_list else dict(zip(keys, values, strict=True))
        await rt.write(
            OperationRecord(
                op_id, OpKind.PARALLEL.value, id, COMPLETED, 1, value_digest(keys),
                to_jsonable(result, what=f"The result of parallel {op_id!r}"), epoch=rt.epoch,
            )
        )
        return result

    # ------------------------------------------------------------------ callbacks and timers

    @traced_callback
    async def callback(self, id: str, payload: Any = None, *, timeout: float | None = None) -> Any:
        """Wait for ``Engine.signal(run_id, <scoped id>, value)`` and return the value.

        The run suspends (status ``waiting``) until the signal arrives; several callbacks may be
        pending at once and each is resolved by its own id. A signal that arrives before the run
        reaches the callback is kept and delivered when it does.
        """
        rt = self._rt
        op_id = self._scope + id
        jpayload = to_jsonable(payload, what=f"The payload of callback {op_id!r}")
        digest = value_digest(jpayload)
        prev = rt.enter(op_id, OpKind.CALLBACK.value, id, digest, while_draining=True)
        if prev is not None:
            if prev.status == COMPLETED:
                return prev.result
            if prev.status == FAILED and prev.epoch >= rt.epoch:
                raise rt.recorded_failure(prev)
        if op_id not in rt.signals:
            # A signal may have arrived while this execution was running; look once more before waiting.
            rt.signals.update(await rt.store.get_signals(rt.run_id))
        if op_id in rt.signals:
            value = rt.signals[op_id]
            await rt.write(
                OperationRecord(op_id, OpKind.CALLBACK.value, id, COMPLETED, 1, digest, value, epoch=rt.epoch)
            )
            return value
        deadline = (prev.meta or {}).get("deadline") if prev is not None and prev.status == STARTED else None
        if deadline is None and timeout is not None:
            deadline = time.time() + timeout
        if deadline is not None and time.time() >= deadline:
            err = CallbackTimeout(op_id, timeout or 0)
            await rt.write(
                OperationRecord(op_id, OpKind.CALLBACK.value, id, FAILED, 1, digest, error=ErrorInfo.from_exception(err), epoch=rt.epoch)
            )
            raise err
        if prev is None or prev.status != STARTED:
            await rt.write(
                OperationRecord(
                    op_id, OpKind.CALLBACK.value, id, STARTED, 1, digest,
                    meta={"payload": jpayload, "deadline": deadline}, epoch=rt.epoch,
                )
            )
        raise Suspend([op_id], deadline)

    async def sleep(self, id: str, seconds: float) -> None:
        """A durable timer: survives restarts; long sleeps suspend the run and a worker wakes it when due."""
        rt = self._rt
        op_id = self._scope + id
        prev = rt.enter(op_id, OpKind.SLEEP.value, id, value_digest(seconds))
        if prev is not None and prev.status == COMPLETED:
            return
        if prev is not None and prev.status == STARTED:
            wake_at = float((prev.meta or {})["wakeAt"])
        else:
            wake_at = time.time() + seconds
            await rt.write(
                OperationRecord(op_id, OpKind.SLEEP.value, id, STARTED, 1, value_digest(seconds), meta={"wakeAt": wake_at}, epoch=rt.epoch),
                check_cancel=True,
            )
        remaining = wake_at - time.time()
        if remaining > rt.inline_sleep_limit:
            raise Suspend([op_id], wake_at)
        if remaining > 0:
            await asyncio.sleep(remaining)
        await rt.write(OperationRecord(op_id, OpKind.SLEEP.value, id, COMPLETED, 1, value_digest(seconds), epoch=rt.epoch))

    # ------------------------------------------------------------------ versioning, progress, state

    def patched(self, change_id: str) -> bool:
        """True for runs that reach this point with the change deployed; False for runs that were
        already past it (replaying history recorded by the old code). Recorded, so the answer never
        changes for a run."""
        return self._rt.patched(self._scope + change_id)

    def progress(self, message: str, *, percent: float | None = None, **data: Any) -> None:
        if self._rt.replaying:
            return  # it was reported when this part of the run first executed
        self._rt.emit("progress", message=message, percent=percent, scope=self._scope or None, **data)

    @property
    def state(self) -> dict[str, Any]:
        """Thread state shared by runs with the same ``thread_id``; persisted at step boundaries."""
        return self._rt.touch_state()

    # ------------------------------------------------------------------ sandbox extension point

    def sandbox(self, id: str, provider: str = "local", **options: Any) -> AbstractAsyncContextManager[Any]:
        factory = self._rt.sandbox_factory
        if factory is None:
            raise RuntimeError(
                "ctx.sandbox needs an engine with sandbox support; use durable_sandbox.Engine "
                "(which wires the sandbox sessions in) rather than durable_sandbox.engine.Engine."
            )
        return factory(self, id, provider=provider, **options)


def _revalidate_branches(items: list[tuple[str, Callable[..., Any]]], recorded: Any, as_list: bool) -> Any:
    """A replayed parallel's result, each branch's value revalidated through that branch's return
    annotation: the same rule as ``ctx.step``, so a branch returning a pydantic model gives the model
    on replay too, not the JSON it was recorded as."""
    if as_list and isinstance(recorded, list) and len(recorded) == len(items):
        return [revalidate(branch, value) for (_, branch), value in zip(items, recorded, strict=True)]
    if not as_list and isinstance(recorded, dict):
        return {key: revalidate(branch, recorded[key]) if key in recorded else None for key, branch in items}
    return recorded


__all__ = ["Context", "DuplicateOperationError"]
