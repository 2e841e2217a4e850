"""The engine's tracing hooks (issue 40): a span per attempt of a run, per step and per callback wait; a step
taken from the journal is an event on its parent span, not a span of its own (it does not run).

Thin on purpose: the engine calls :func:`traced_attempt` once per execution and wears :func:`traced_step` and
:func:`traced_callback` on ``Context.step``/``callback``; each looks its :class:`Tracing` up in the run's
extensions and, without one, calls straight through (one dictionary lookup: tracing off costs nothing
measurable, docs/benchmarks.md). What a span holds: docs/operations.md ("Traces").
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from durable_sandbox.engine.errors import Handover, LeaseLost, Suspend
from durable_sandbox.engine.records import OpStatus
from durable_sandbox.tracing import (
    ATTEMPT_LABEL,
    TRACEPARENT_ENV,
    TRACEPARENT_LABEL,
    Tracing,
    valid_traceparent,
)
from durable_sandbox.tracing.spans import AttributeValue, SpanHandle

if TYPE_CHECKING:
    from durable_sandbox.engine.extensions import Extensions
    from durable_sandbox.engine.records import RunRecord
    from durable_sandbox.engine.runtime import RunRuntime

log = logging.getLogger("durable_sandbox.tracing")

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound="Scoped")


class Scoped(Protocol):
    """What the hooks read of a context (``engine.context.Context``, which imports this module)."""

    @property
    def operations(self) -> RunRuntime: ...

    @property
    def scope(self) -> str: ...

RUN_ID = "durable_sandbox.run.id"
WORKFLOW = "durable_sandbox.workflow"
OP_ID = "durable_sandbox.operation.id"
OP_KIND = "durable_sandbox.operation.kind"
OP_NAME = "durable_sandbox.operation.name"
OUTCOME = "durable_sandbox.outcome"
REPLAYED_EVENT = "durable_sandbox.replayed"


def tracing_of(rt: RunRuntime) -> Tracing | None:
    return rt.extensions.get(Tracing)


async def within(tracing: Tracing, name: str, attributes: Mapping[str, AttributeValue | None],
                 body: Callable[[], Awaitable[T]], *, parent: str | None = None, links: tuple[str, ...] = (),
                 done: Callable[[SpanHandle, T], None] | None = None,
                 opened: Callable[[SpanHandle], Awaitable[None]] | None = None) -> T:
    """Await ``body`` inside a span: waiting (``Suspend``), an interruption and a hand-over end it with their
    outcome, not as errors; any other exception fails it."""
    with tracing.spans.span(name, attributes, parent=parent, links=links) as span:
        if opened is not None:
            await opened(span)
        try:
            value = await body()
        except Suspend:
            span.set(OUTCOME, "waiting")
            raise
        except (asyncio.CancelledError, Handover, LeaseLost) as exc:
            span.set(OUTCOME, "interrupted" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__)
            raise
        except BaseException as exc:
            span.set(OUTCOME, "failed")
            span.fail(exc)
            raise
        span.set(OUTCOME, "completed")
        if done is not None:
            done(span, value)
        return value


def replayed(tracing: Tracing, rt: RunRuntime, op_id: str, kind: str) -> bool:
    """True (and an event on the current span) when ``op_id`` is completed in the journal: replay returns its
    recorded result without running it, so it gets no span of its own."""
    rec = rt.latest.get(op_id)
    if rec is None or rec.status != OpStatus.COMPLETED:
        return False
    tracing.spans.event(REPLAYED_EVENT, {OP_ID: op_id, OP_KIND: kind, OP_NAME: rec.name})
    return True


def traced_attempt(rt: RunRuntime, run: RunRecord, body: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """The workflow coroutine of one execution (an attempt) of ``run``, inside a span when tracing is on: the
    child of the caller's traceparent (the run's label), linked to the attempt before it, whose traceparent
    the run's labels keep (written here, fenced, when the attempt starts)."""
    tracing = tracing_of(rt)
    if tracing is None:
        return body
    parent = valid_traceparent(run.labels.get(TRACEPARENT_LABEL))
    earlier = valid_traceparent(run.labels.get(ATTEMPT_LABEL))

    async def record(span: SpanHandle) -> None:
        own = span.traceparent()
        if own is None:
            return
        try:
            await rt.store.update_run(run.run_id, {"labels": {**run.labels, ATTEMPT_LABEL: own}}, fence=rt.fence)
        except Exception as exc:  # a trace's link must never fail the run: the run's next write says what is wrong
            log.info("run %s: could not record its attempt's trace context (%s); the next attempt will not link "
                     "to this one", run.run_id, exc)

    async def attempt() -> T:
        return await body

    attributes: dict[str, AttributeValue | None] = {
        RUN_ID: run.run_id, WORKFLOW: run.workflow, "durable_sandbox.run.epoch": rt.epoch,
        "durable_sandbox.run.resumed": bool(rt.rows),
        "durable_sandbox.run.journaled_operations": len(rt.rows),
    }
    return within(tracing, f"run {run.workflow}", attributes, attempt, parent=parent,
                  links=(earlier,) if earlier else (), opened=record)


def caller_labels(extensions: Extensions, labels: dict[str, str] | None, environ: Mapping[str, str]) -> dict[str, str] | None:
    """``labels`` with the caller's trace context recorded (the run's attempts become its children): a
    traceparent the caller put in the labels stands; else the caller's current span; else ``TRACEPARENT`` in
    the environment (``dsb run`` inside another traced tool). Unchanged when tracing is off."""
    tracing = extensions.get(Tracing)
    if tracing is None or (labels and TRACEPARENT_LABEL in labels):
        return labels
    caller = tracing.spans.current() or valid_traceparent(environ.get(TRACEPARENT_ENV))
    if caller is None:
        return labels
    return {**(labels or {}), TRACEPARENT_LABEL: caller}


def traced_step(method: Callable[Concatenate[C, str, P], Awaitable[T]]) -> Callable[Concatenate[C, str, P], Awaitable[T]]:
    """``Context.step`` in a span ``step <op id>`` (an event when it comes from the journal)."""

    @functools.wraps(method)
    async def step(self: C, id: str, *args: P.args, **kwargs: P.kwargs) -> T:
        rt = self.operations
        tracing = tracing_of(rt)
        if tracing is None:
            return await method(self, id, *args, **kwargs)
        op_id = self.scope + id
        if replayed(tracing, rt, op_id, "step"):
            return await method(self, id, *args, **kwargs)
        return await within(tracing, f"step {op_id}", {OP_ID: op_id, OP_KIND: "step"},
                            lambda: method(self, id, *args, **kwargs))

    return step


def traced_callback(method: Callable[Concatenate[C, str, P], Awaitable[T]]) -> Callable[Concatenate[C, str, P], Awaitable[T]]:
    """``Context.callback`` in a span ``callback <op id>``: short when the signal is there, else it ends with
    the outcome ``waiting`` as the run suspends (the wait itself is between two attempts)."""

    @functools.wraps(method)
    async def callback(self: C, id: str, *args: P.args, **kwargs: P.kwargs) -> T:
        rt = self.operations
        tracing = tracing_of(rt)
        if tracing is None:
            return await method(self, id, *args, **kwargs)
        op_id = self.scope + id
        if replayed(tracing, rt, op_id, "callback"):
            return await method(self, id, *args, **kwargs)
        return await within(tracing, f"callback {op_id}", {OP_ID: op_id, OP_KIND: "callback"},
                            lambda: method(self, id, *args, **kwargs))

    return callback


async def under_caller(rt: RunRuntime, traceparent: str | None, name: str,
                       attributes: Mapping[str, AttributeValue | None], body: Callable[[], Awaitable[T]]) -> T:
    """``body`` in a span ``name``, the child of a request's ``traceparent`` header (a Sandbox's session call
    through the call API); straight through when tracing is off."""
    tracing = tracing_of(rt)
    if tracing is None:
        return await body()
    return await within(tracing, name, attributes, body, parent=valid_traceparent(traceparent))
