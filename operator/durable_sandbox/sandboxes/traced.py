"""The sandbox sessions' tracing hooks (issue 40): spans for provisioning, calls, snapshots and their deletion,
a loss and the restore that follows it, and every call a restore replays into the replacement (marked
``durable_sandbox.replay``); a call taken from the journal is an event. Each sandbox call gets ``TRACEPARENT``
in its environment (shell calls: the only kind with one), so the agent's own tools can continue the trace.

Thin on purpose, like engine/traced.py: decorators on the methods of ``SandboxSession`` (its calls) and of the
pieces it is made of (``Provisioner``, ``Checkpointer``, ``Recoverer``), and a provider wrapper
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
    """What the hooks read of a session: a ``SandboxSession`` itself, or a piece's ``SessionScope`` (the session
    and its pieces import this module, not the other way round)."""

    @property
    def rt(self) -> RunRuntime: ...

    @property
    def sid(self) -> str: ...

    @property
    def provider(self) -> SandboxProvider: ...

    @property
    def generation(self) -> int: ...

    @property
    def handle(self) -> SandboxHandle | None: ...

    @property
    def state(self) -> Restores: ...


class _ScopeView:
    """A piece's ``scope`` (``sandboxes/scope.py``) read as the hooks read a session."""

    def __init__(self, scope: Any) -> None:
        self._scope = scope

    rt = property(lambda self: self._scope.rt)
    sid = property(lambda self: self._scope.sid)
    provider = property(lambda self: self._scope.provider)
    generation = property(lambda self: self._scope.generation)
    state = property(lambda self: self._scope.state)
    handle = property(lambda self: self._scope.state.handle)


def _session(owner: Any) -> Session:
    """The session a hooked method belongs to: the object itself, or the scope of the piece it is a method of."""
    scope = getattr(owner, "scope", None)
    return cast(Session, _ScopeView(scope) if scope is not None else owner)


S = TypeVar("S")


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
        session = _session(self)
        tracing = tracing_of(session.rt)
        if tracing is None:
            return await method(self, tool_call, *args, **kwargs)
        op_id = journal.call_id(session.sid, tool_call.operation_id)
        if replayed(tracing, session.rt, op_id, journal.CALL):
            return await method(self, tool_call, *args, **kwargs)
        attributes = {**_base(session), OP_ID: op_id, OP_KIND: journal.CALL, CALL_TYPE: tool_call.type, REPLAY: False}
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
            session = _session(self)
            tracing = tracing_of(session.rt)
            if tracing is None:
                return await method(self, *args, **kwargs)
            op_id = recorded(session, args) if recorded is not None else None
            if op_id is not None and replayed(tracing, session.rt, op_id, name):
                return await method(self, *args, **kwargs)
            attributes = {**_base(session), OP_KIND: name, OP_ID: op_id, **_arguments(name, args, kwargs)}
            token = _restoring.set(True) if name == journal.RESTORE else None
            try:
                return await within(tracing, name, attributes, lambda: method(self, *args, **kwargs),
                                    done=lambda span, _: _after(name, session, span))
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
    """The journal id of ``Checkpointer.checkpoint(count)``: a replay passes checkpoints that are recorded already."""
    return journal.snapshot_id(session.sid, args[0], session.generation, session.state.rewinds) if args else None


def delete_record(session: Any, args: tuple[Any, ...]) -> str | None:
    """The journal id of ``Checkpointer.delete(checkpoint)``."""
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


def _wear(cls: type[T], hooks: dict[str, Callable[[Any], Any]]) -> type[T]:
    """``cls`` with ``hooks`` worn on its methods (so its own code stays as it was): a method renamed or removed
    fails here, at import, never as a span that silently stops."""
    if cls.__dict__.get("_dsb_traced"):
        return cls
    for name, hook in hooks.items():
        method = cls.__dict__.get(name)
        if method is None:
            raise TypeError(f"{cls.__name__} has no method {name!r} for its tracing hook (sandboxes/traced.py)")
        setattr(cls, name, hook(method))
    setattr(cls, "_dsb_traced", True)  # noqa: B010 - a marker on the class, not an attribute of its instances
    return cls


def traced_session(cls: type[T]) -> type[T]:
    """``SandboxSession`` with its calls in spans (a class decorator)."""
    return _wear(cls, {"call": traced_call})


def traced_pieces(provisioner: type[Any], checkpointer: type[Any], recoverer: type[Any]) -> None:
    """The session's pieces with their lifecycle in spans: provisioning, checkpoints and their deletion, a loss
    (what it sets off: destroy the lost sandbox, restore) and the restore."""
    _wear(provisioner, {"provision": traced_lifecycle(journal.PROVISION)})
    _wear(checkpointer, {"checkpoint": traced_lifecycle(journal.SNAPSHOT, recorded=snapshot_record),
                         "delete": traced_lifecycle(journal.SNAPSHOT_DELETE, recorded=delete_record)})
    _wear(recoverer, {"recover": traced_lifecycle(LOSS), "restore": traced_lifecycle(journal.RESTORE)})


def traced_provider(rt: RunRuntime, sid: str, provider: SandboxProvider) -> SandboxProvider:
    """``provider`` as session ``sid`` of run ``rt`` uses it: itself when tracing is off."""
    tracing = tracing_of(rt)
    if tracing is None:
        return provider
    return cast(SandboxProvider, _TracedProvider(provider, tracing, sid))
