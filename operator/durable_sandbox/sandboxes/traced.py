"""The sandbox sessions' tracing hooks (issue 40): spans for provisioning, calls, snapshots and their deletion,
a loss and the restore that follows it, and every call a restore replays into the replacement (marked
``durable_sandbox.replay``); a call taken from the journal is an event. Each sandbox call gets ``TRACEPARENT``
in its environment (shell calls: the only kind with one), so the agent's own tools can continue the trace.

Thin on purpose, like engine/traced.py: decorators on ``SandboxSession``'s methods and a provider wrapper
(:func:`traced_provider`) that only exists while tracing is on. The wrapper adds ``TRACEPARENT`` after the
call was journaled and digested, so the journal never holds it and a replay's digest does not change.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from durable_sandbox.engine.traced import OP_ID, OP_KIND, replayed, tracing_of, within
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider, ToolCall, ToolResult
from durable_sandbox.sandboxes import journal
from durable_sandbox.tracing import TRACEPARENT_ENV, Tracing
from durable_sandbox.tracing.spans import AttributeValue, SpanHandle

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime

P = ParamSpec("P")
T = TypeVar("T")

SESSION = "durable_sandbox.sandbox.session"
PROVIDER = "durable_sandbox.sandbox.provider"
SANDBOX_ID = "durable_sandbox.sandbox.id"
SNAPSHOT_ID = "durable_sandbox.snapshot.id"
CALL_TYPE = "durable_sandbox.call.type"
REPLAY = "durable_sandbox.replay"
EXIT_CODE = "process.exit.code"  # OpenTelemetry's semantic convention for a process's exit code

# Set while a restore replays calls into a replacement sandbox: the provider wrapper gives each a span.
_restoring: ContextVar[bool] = ContextVar("durable_sandbox_restoring", default=False)


class Restores(Protocol):
    @property
    def restores(self) -> int: ...


class Session(Protocol):
    """What the hooks read of a ``sandboxes.session.SandboxSession`` (which imports this module)."""

    rt: RunRuntime
    sid: str
    provider: SandboxProvider
    generation: int

    @property
    def handle(self) -> SandboxHandle | None: ...

    @property
    def state(self) -> Restores: ...


S = TypeVar("S", bound=Session)


def _base(session: Session) -> dict[str, AttributeValue | None]:
    return {SESSION: session.sid, PROVIDER: session.provider.name}


def _result_attributes(span: SpanHandle, result: ToolResult) -> None:
    span.set(EXIT_CODE, result.exit_code)
    span.set("durable_sandbox.call.stdout.bytes", result.stdout_size if result.stdout_size is not None
             else len(result.stdout.encode()))
    span.set("durable_sandbox.call.stderr.bytes", result.stderr_size if result.stderr_size is not None
             else len(result.stderr.encode()))


def traced_call(method: Callable[Concatenate[S, ToolCall, P], Awaitable[ToolResult]]
                ) -> Callable[Concatenate[S, ToolCall, P], Awaitable[ToolResult]]:
    """``SandboxSession.call`` in a span ``sandbox.call <type>`` (op id, kind, exit code, bytes; never the
    command or its output: they may hold what the caller would not export)."""

    @functools.wraps(method)
    async def call(self: S, tool_call: ToolCall, *args: P.args, **kwargs: P.kwargs) -> ToolResult:
        tracing = tracing_of(self.rt)
        if tracing is None:
            return await method(self, tool_call, *args, **kwargs)
        op_id = journal.call_id(self.sid, tool_call.operation_id)
        if replayed(tracing, self.rt, op_id, journal.CALL):
            return await method(self, tool_call, *args, **kwargs)
        attributes = {**_base(self), OP_ID: op_id, OP_KIND: journal.CALL, CALL_TYPE: tool_call.type, REPLAY: False}
        return await within(tracing, f"sandbox.call {tool_call.type}", attributes,
                            lambda: method(self, tool_call, *args, **kwargs), done=_result_attributes)

    return call


def traced_lifecycle(name: str, *, recorded: Callable[[Any, tuple[Any, ...]], str | None] | None = None
                     ) -> Callable[[Callable[Concatenate[S, P], Awaitable[T]]], Callable[Concatenate[S, P], Awaitable[T]]]:
    """A session's lifecycle method in a span ``name``; ``recorded`` names its journal record, when a replay
    may meet it completed (then it is an event, not a span)."""

    def wrap(method: Callable[Concatenate[S, P], Awaitable[T]]) -> Callable[Concatenate[S, P], Awaitable[T]]:
        @functools.wraps(method)
        async def lifecycle(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
            tracing = tracing_of(self.rt)
            if tracing is None:
                return await method(self, *args, **kwargs)
            op_id = recorded(self, args) if recorded is not None else None
            if op_id is not None and replayed(tracing, self.rt, op_id, name):
                return await method(self, *args, **kwargs)
            attributes = {**_base(self), OP_KIND: name, OP_ID: op_id, **_arguments(name, args, kwargs)}
            token = _restoring.set(True) if name == journal.RESTORE else None
            try:
                return await within(tracing, name, attributes, lambda: method(self, *args, **kwargs),
                                    done=lambda span, _: _after(name, self, span))
            finally:
                if token is not None:
                    _restoring.reset(token)

        return lifecycle

    return wrap


def _arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, AttributeValue | None]:
    if name == journal.SNAPSHOT and args:
        return {"durable_sandbox.snapshot.count": args[0]}
    if name == journal.SNAPSHOT_DELETE and args:
        return {SNAPSHOT_ID: getattr(args[0], "snapshot_id", None)}
    if name == LOSS and args:
        return {"durable_sandbox.loss.reason": str(args[0])}
    if name == journal.RESTORE:
        return {"durable_sandbox.restore.reason": kwargs.get("reason")}
    return {}


def _after(name: str, session: Session, span: SpanHandle) -> None:
    handle = session.handle
    if name in (journal.PROVISION, journal.RESTORE) and handle is not None:
        span.set(SANDBOX_ID, handle.id)
    if name == journal.RESTORE:
        rec = session.rt.lookup(journal.restore_id(session.sid, session.state.restores))
        meta = (rec.meta or {}) if rec is not None else {}
        span.set(SNAPSHOT_ID, meta.get(journal.META_SNAPSHOT_ID))
        span.set("durable_sandbox.restore.replayed", len(meta.get(journal.META_REPLAYED) or []))
        span.set("durable_sandbox.restore.skipped", len(meta.get(journal.META_SKIPPED) or []))


def snapshot_record(session: Any, args: tuple[Any, ...]) -> str | None:
    """The journal id of ``_checkpoint(count)``: a replay passes checkpoints that are recorded already."""
    return journal.snapshot_id(session.sid, args[0], session.generation) if args else None


def delete_record(session: Any, args: tuple[Any, ...]) -> str | None:
    """The journal id of ``_delete_snapshot(checkpoint)``."""
    return journal.delete_id(args[0].op_id) if args else None


LOSS = "sandbox.loss"  # a span name, not a journal kind: the loss is seen, then recovered from


class _TracedProvider:
    """``provider`` for one session while tracing is on: each call gets ``TRACEPARENT`` (the current span's),
    and a call a restore replays gets a span of its own (the session's call span covers the others)."""

    def __init__(self, inner: SandboxProvider, tracing: Tracing, sid: str) -> None:
        self.inner = inner
        self._tracing = tracing
        self._sid = sid

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        if not _restoring.get():
            return await self.inner.execute(handle, _with_traceparent(call, self._tracing.spans.current()))
        attributes: dict[str, AttributeValue | None] = {
            SESSION: self._sid, PROVIDER: self.inner.name, OP_KIND: journal.CALL,
            OP_ID: journal.call_id(self._sid, call.operation_id), CALL_TYPE: call.type, REPLAY: True,
            SANDBOX_ID: handle.id,
        }

        async def replay() -> ToolResult:
            return await self.inner.execute(handle, _with_traceparent(call, self._tracing.spans.current()))

        return await within(self._tracing, f"sandbox.call {call.type}", attributes, replay, done=_result_attributes)


def _with_traceparent(call: ToolCall, traceparent: str | None) -> ToolCall:
    if traceparent is None or call.type != "shell":
        return call
    env = dict(call.args.get("env") or {})
    env.setdefault(TRACEPARENT_ENV, traceparent)  # the caller's own TRACEPARENT stands
    return call.model_copy(update={"args": {**call.args, "env": env}})


def traced_session(cls: type[S]) -> type[S]:
    """``SandboxSession`` with its hooks worn (a class decorator, so the session's own code stays as it was): a
    method renamed or removed fails here, at import, never as a span that silently stops."""
    hooks: dict[str, Callable[[Any], Any]] = {
        "call": traced_call,
        "_provision": traced_lifecycle(journal.PROVISION),
        "_checkpoint": traced_lifecycle(journal.SNAPSHOT, recorded=snapshot_record),
        "_delete_snapshot": traced_lifecycle(journal.SNAPSHOT_DELETE, recorded=delete_record),
        "_recover": traced_lifecycle(LOSS),  # what a loss sets off: destroy the lost sandbox, restore
        "_restore": traced_lifecycle(journal.RESTORE),
    }
    for name, hook in hooks.items():
        method = cls.__dict__.get(name)
        if method is None:
            raise TypeError(f"{cls.__name__} has no method {name!r} for its tracing hook (sandboxes/traced.py)")
        setattr(cls, name, hook(method))
    return cls


def traced_provider(rt: RunRuntime, sid: str, provider: SandboxProvider) -> SandboxProvider:
    """``provider`` as session ``sid`` of run ``rt`` uses it: itself when tracing is off."""
    tracing = tracing_of(rt)
    if tracing is None:
        return provider
    return cast(SandboxProvider, _TracedProvider(provider, tracing, sid))
