"""How a step function is called: a sync one inline on the loop once it has shown it is quick, else in a thread
(abandoned at its timeout); an async one's coroutine up to its first suspension before its start is committed.

The step's durable protocol around the call (its records, retries, cache) is engine/steps.py's.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.coroutines import Rest, first_stretch
from durable_sandbox.engine.errors import StepTimeout
from durable_sandbox.engine.step_threads import run_abandonable

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime

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


def judged_code(fn: Callable[..., Any], timeout: float | None) -> Any:
    """The code object by which ``fn``'s quickness is judged; None when it must never run inline."""
    return _code_of(fn) if timeout is None else None


def runs_inline(code: Any) -> bool:
    return code is not None and _observed.get(code, 0) >= QUICK_RUNS


def is_async(fn: Callable[..., Any]) -> bool:
    code = _code_of(fn)
    if code is not None:  # a function or a partial of one: its code says (the cheap test, on every step)
        return bool(code.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "func", None))


async def invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None,
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


async def invoke_async(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
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
