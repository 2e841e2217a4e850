"""Framework-neutral core of the checkpointed agent adapters.

One logical agent invocation (an LLM loop: model call, tool calls, model call, ...) is journaled as
ordinary ``ctx.step`` operations of the enclosing run:

- every model call is a step ``<agent-id>/model/<n>`` (n = 1, 2, ... in call order) whose result is
  the model's complete response (for a streaming model, the full list of stream events);
- every tool call is a step ``<agent-id>/tool/<n>-<toolname>`` whose result is the tool's result.

On resume the workflow re-creates the agent and invokes it again; recorded model responses and tool
results are returned from the journal, so the agent rebuilds the same conversation without calling the
model or re-running any tool whose result was committed. Only a call that had started without
completing runs again (at-least-once, like every step).

Tool numbers are assigned in the order the model *requested* the tools (:meth:`DurableAgentRun.plan_tools`
with the call ids from the model's response), not in the order concurrent tools happen to start, so a
framework that runs tools concurrently still gets stable ids.

A tool may call the run's sandbox: calls it makes without an operation id are named after the tool
call, ``<agent-id>/tool/<n>-<toolname>/sbx/<k>`` (``sandboxes/call_scope.py``), so a tool replayed from
the journal (which does not make them) shifts no other call, and a tool run again after a crash finds
its committed calls in the journal instead of running them again.

An adapter for a framework (``strands.py`` is the first) intercepts the framework's model and tool calls
and routes them through :meth:`DurableAgentRun.model_call` and :meth:`DurableAgentRun.tool_call`; a
hand-written agent loop can use them directly.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from durable_sandbox.engine import Context, RetryPolicy
from durable_sandbox.sandboxes.call_scope import call_scope

_BYTES = "__dsb_bytes__"
_current: contextvars.ContextVar[DurableAgentRun | None] = contextvars.ContextVar("durable_agent_run", default=None)


# ---------------------------------------------------------------------- values


def encode(value: Any) -> Any:
    """A JSON-safe copy of ``value``: bytes become ``{"__dsb_bytes__": base64}``, tuples lists,
    pydantic models their JSON dump. Framework payloads (images, reasoning signatures) carry bytes."""
    if isinstance(value, bytes | bytearray):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return encode(dump(mode="json"))
    raise TypeError(
        f"Agent adapter: a value of type {type(value).__qualname__} cannot be journaled; model responses and "
        f"tool results must be JSON, bytes or pydantic models."
    )


def decode(value: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES in value:
            return base64.b64decode(value[_BYTES])
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def digest(value: Any) -> str:
    """A stable digest of a request (messages, system prompt, tool names) for the replay check."""
    data = json.dumps(encode_lenient(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()[:32]


def encode_lenient(value: Any) -> Any:
    try:
        return encode(value)
    except TypeError:
        if isinstance(value, dict):
            return {str(k): encode_lenient(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [encode_lenient(v) for v in value]
        return f"<{type(value).__module__}.{type(value).__qualname__}>"


def tool_slug(name: str) -> str:
    """Tool names as they appear in op ids: no '/', no whitespace."""
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", name) or "tool"


# ---------------------------------------------------------------------- the run


class DurableAgentRun:
    """The journal of one logical agent invocation inside a workflow run.

    ``agent_id`` must be unique within the run (invoke the same agent twice with two ids, e.g.
    ``"coder"`` and ``"coder-rework-1"``). ``model_retry``/``tool_retry``/``tool_timeout`` are the
    :class:`RetryPolicy` and timeout of the underlying steps. ``check_input`` makes every model
    call's request (messages, system prompt, tool names) part of its input digest, so a replay that
    would feed the model a different conversation fails with ``NonDeterminismError`` instead of
    returning a response recorded for another question.
    """

    def __init__(
        self,
        ctx: Context,
        agent_id: str,
        *,
        model_retry: RetryPolicy | None = None,
        model_timeout: float | None = None,
        tool_retry: RetryPolicy | None = None,
        tool_timeout: float | None = None,
        check_input: bool = True,
    ) -> None:
        if not agent_id or agent_id.strip("/") != agent_id:
            raise ValueError(f"Agent id {agent_id!r} must be non-empty and not start or end with '/'.")
        self.ctx = ctx
        self.agent_id = agent_id
        self.model_retry = model_retry
        self.model_timeout = model_timeout
        self.tool_retry = tool_retry
        self.tool_timeout = tool_timeout
        self.check_input = check_input
        self.model_calls = 0
        self.tool_calls = 0
        self._tool_numbers: dict[str, int] = {}
        self._aborted: BaseException | None = None

    # ------------------------------------------------------------------ ids

    def model_op(self, n: int) -> str:
        return f"{self.agent_id}/model/{n}"

    def tool_op(self, n: int, name: str) -> str:
        return f"{self.agent_id}/tool/{n}-{tool_slug(name)}"

    def plan_tools(self, call_ids: Iterable[str]) -> None:
        """Number the tool calls a model response requested, in the order it requested them."""
        for call_id in call_ids:
            if call_id and call_id not in self._tool_numbers:
                self.tool_calls += 1
                self._tool_numbers[call_id] = self.tool_calls

    def _tool_number(self, call_id: str | None) -> int:
        if call_id:
            if call_id not in self._tool_numbers:
                self.plan_tools([call_id])
            return self._tool_numbers[call_id]
        self.tool_calls += 1
        return self.tool_calls

    # ------------------------------------------------------------------ journaled calls

    async def model_call(
        self, fn: Callable[[], Any], *, request: Any = None, name: str = "model"
    ) -> Any:
        """Run one model call as step ``<agent-id>/model/<n>``; on replay return the recorded response.

        ``fn()`` returns the complete response (JSON, bytes or pydantic models; decoded on the way
        back so the live and the replayed value are identical). ``request`` is digested for the replay check.
        """
        self.check()
        self.model_calls += 1
        op = self.model_op(self.model_calls)
        req = digest(request) if (self.check_input and request is not None) else None

        call = _encoded_call(fn, f"agent-model:{name}")
        recorded = await self._step(op, call, req, retry=self.model_retry, timeout=self.model_timeout)
        return decode(recorded)

    async def tool_call(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        call_id: str | None = None,
        input: Any = None,
    ) -> Any:
        """Run one tool call as step ``<agent-id>/tool/<n>-<name>``; a committed result is never re-run.

        ``call_id`` is the id the model gave the call (numbered by :meth:`plan_tools` if it was
        planned); ``input`` is digested for the replay check.
        """
        self.check()
        op = self.tool_op(self._tool_number(call_id), name)
        req = digest(input) if self.check_input and input is not None else None

        # Sandbox calls the tool makes are named after this step (``<op>/sbx/<k>``): replaying the step from the
        # journal, which does not make them, shifts no other call, and a re-run of the step finds them journaled.
        call = _encoded_call(fn, f"agent-tool:{tool_slug(name)}", scope=op)
        recorded = await self._step(op, call, req, retry=self.tool_retry, timeout=self.tool_timeout)
        return decode(recorded)

    async def _step(self, op: str, call: Any, req: str | None, **options: Any) -> Any:
        try:
            return await self.ctx.step(op, call, req, **options)
        except Exception:
            raise
        except BaseException as exc:  # Suspend, cancellation, process-death simulations
            self.abort(exc)
            raise

    # ------------------------------------------------------------------ control flow that frameworks swallow

    def abort(self, exc: BaseException) -> None:
        """Remember a control-flow exception (the run suspending, being cancelled, dying) raised inside a
        call. Frameworks that run tools in tasks may drop it; every later call of this invocation re-raises
        it instead of journaling work done on a broken conversation, and :meth:`reraise` surfaces it."""
        if self._aborted is None:
            self._aborted = exc

    def check(self) -> None:
        if self._aborted is not None:
            raise self._aborted

    @property
    def aborted(self) -> BaseException | None:
        return self._aborted

    # ------------------------------------------------------------------ current run (for framework hooks)

    def activate(self) -> contextvars.Token[DurableAgentRun | None]:
        return _current.set(self)

    @staticmethod
    def deactivate(token: contextvars.Token[DurableAgentRun | None]) -> None:
        _current.reset(token)


def current_run() -> DurableAgentRun | None:
    """The agent invocation being journaled in this task (None outside an adapter's ``invoke``)."""
    return _current.get()


@runtime_checkable
class DurableAgent(Protocol):
    """What a framework integration offers: invoke the framework's agent with every model and tool call
    journaled under ``agent_id`` in the run of ``ctx``."""

    async def invoke(self, ctx: Context, agent_id: str, prompt: Any, **kwargs: Any) -> Any: ...


__all__ = ["DurableAgent", "DurableAgentRun", "current_run", "decode", "digest", "encode", "tool_slug"]


def _encoded_call(fn: Callable[[], Any], name: str, *, scope: str | None = None) -> Callable[[str | None], Awaitable[Any]]:
    """A step function for one model or tool call. Its argument is the request digest, which only feeds
    the step's input check; ``name`` is what the journal records (and replay compares). With ``scope`` (a tool
    call's op id), sandbox calls made inside are named after it (sandboxes/call_scope.py)."""

    async def call(_request_digest: str | None) -> Any:
        with call_scope(scope) if scope is not None else contextlib.nullcontext():
            value = fn()
            if hasattr(value, "__await__"):
                value = await value
        return encode(value)

    call.__name__ = call.__qualname__ = name
    return call
