"""The workflow context: ``ctx.step``, ``ctx.parallel``, ``ctx.callback``, ``ctx.sleep``, ``ctx.patched``,
``ctx.progress``, ``ctx.state``, ``ctx.query_handler``/``update_handler`` (engine/run_handlers.py, engine/updates.py)
and the ``ctx.sandbox`` extension point.

Operations are matched to the journal by explicit id, never by call order, so concurrent branches
replay correctly whatever order they finish in. A completed operation returns its recorded result
without running; a started-but-unfinished one runs again with the same id (at-least-once).

The context is the API and its scoping; each operation's protocol is a module of its own: a step's in
engine/steps.py (how its function is called: engine/step_calls.py), the fan-out's in engine/parallel.py,
callbacks' and timers' in engine/waits.py, all recording through the run's ``RunRuntime``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from durable_sandbox.engine.children import ChildWorkflows
from durable_sandbox.engine.continue_as_new import ContinuesAsNew
from durable_sandbox.engine.errors import DuplicateOperationError
from durable_sandbox.engine.parallel import run_parallel
from durable_sandbox.engine.policies import RetryPolicy
from durable_sandbox.engine.steps import run_step
from durable_sandbox.engine.traced import traced_callback, traced_step
from durable_sandbox.engine.waits import durable_sleep, wait_for_callback

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime

T = TypeVar("T")


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

    # ------------------------------------------------------------------ operations

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
        """Run ``fn(*args, **kwargs)`` once, durably: its recorded result on replay (engine/steps.py)."""
        result: T = await run_step(self._rt, self._scope + id, fn, args, kwargs, retry=retry, timeout=timeout,
                                   cache_key=cache_key, cache_ttl=cache_ttl, check_input=check_input)
        return result

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
        return await run_parallel(self, id, branches, max_concurrency=max_concurrency, retry=retry, timeout=timeout)

    @traced_callback
    async def callback(self, id: str, payload: Any = None, *, timeout: float | None = None) -> Any:
        """Wait for ``Engine.signal(run_id, <scoped id>, value)`` and return the value.

        The run suspends (status ``waiting``) until the signal arrives; several callbacks may be
        pending at once and each is resolved by its own id. A signal that arrives before the run
        reaches the callback is kept and delivered when it does.
        """
        return await wait_for_callback(self._rt, self._scope + id, id, payload, timeout)

    async def sleep(self, id: str, seconds: float) -> None:
        """A durable timer: survives restarts; long sleeps suspend the run and a worker wakes it when due."""
        await durable_sleep(self._rt, self._scope + id, id, seconds)

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

    # ------------------------------------------------------------------ queries and updates

    def query_handler(self, name: str, fn: Callable[..., Any] | None = None) -> Any:
        """Answer ``Engine.query(run_id, name, arg)`` (``dsb query``) with ``fn()`` or ``fn(arg)``: a plain
        function reading the workflow's state, never journaled (engine/updates.py). Also a decorator:
        ``@ctx.query_handler("total")``."""

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            self._rt.handlers.register_query(name, f)
            return f

        return register(fn) if fn is not None else register

    def update_handler(
        self, name: str, fn: Callable[..., Any] | None = None, *, validator: Callable[[Any], Any] | None = None
    ) -> Any:
        """Apply ``Engine.update(run_id, name, input)`` (``dsb update``) with ``fn(input)``: a plain function
        that changes the workflow's state and returns the caller's answer. The input is validated by ``fn``'s
        parameter annotation (a pydantic model, any type) and by ``validator`` (raise, return False or return the
        reason as a string, to refuse); the update is journaled and applied exactly once. Also a decorator."""

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            self._rt.handlers.register_update(name, f, validator)
            return f

        return register(fn) if fn is not None else register

    # ------------------------------------------------------------------ sandbox extension point

    def sandbox(self, id: str, provider: str = "local", **options: Any) -> AbstractAsyncContextManager[Any]:
        factory = self._rt.sandbox_factory
        if factory is None:
            raise RuntimeError(
                "ctx.sandbox needs an engine with sandbox support; use durable_sandbox.Engine "
                "(which wires the sandbox sessions in) rather than durable_sandbox.engine.Engine."
            )
        return factory(self, id, provider=provider, **options)


__all__ = ["Context", "DuplicateOperationError"]
