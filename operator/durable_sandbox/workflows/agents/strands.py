"""Checkpointed ``strands-agents`` agents: every model call and tool call of an ``Agent`` invocation is a
step of the enclosing durable run (``pip install 'durable-sandbox[agents]'``).

```python
from strands import Agent
from durable_sandbox.workflows.agents.strands import DurableStrandsAgent

@durable_sandbox.workflow(name="fix-bug")
async def fix_bug(ctx, issue: dict) -> str:
    agent = Agent(model=my_model, tools=[read_file, run_tests], callback_handler=None)  # build it inside the workflow
    result = await DurableStrandsAgent(agent).invoke(ctx, "coder", f"Fix: {issue['title']}")
    return str(result)
```

Interception points (strands >= 1.x public APIs):

- **model**: each ``Model.stream(...)`` call runs through :class:`DurableModel`, a ``Model`` that wraps
  the real one and journals the call's complete list of stream events as one step
  ``<agent-id>/model/<n>``; replay yields the recorded events, so strands rebuilds the same message
  (the callback handler even sees the same deltas). It is installed per call through the
  ``InvokeModelStage.Input`` middleware (so it wraps whichever model a ``ModelRouter`` chose), or, on a
  strands without middleware, by wrapping ``agent.model`` for the invocation.
- **tools**: a ``BeforeToolCallEvent`` hook (registered last) replaces the selected tool with
  :class:`DurableTool`, an ``AgentTool`` that runs the real tool as step ``<agent-id>/tool/<n>-<name>``
  and yields the recorded ``ToolResult``. Tools are numbered in the order the model requested them, so
  strands' concurrent tool executor still gets stable ids.

Not journaled: ``aux_model`` side calls (summarization and the like: give the agent a deterministic
conversation manager, or none), session managers' own I/O, and strands interrupts raised by tools
(use ``ctx.callback`` from the workflow instead: a tool can reach the run's context through
``current_run().ctx``).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from typing import Any

from strands.hooks import BeforeToolCallEvent
from strands.models.model import Model
from strands.types._events import ToolInterruptEvent, ToolResultEvent, ToolStreamEvent
from strands.types.tools import AgentTool

from durable_sandbox.engine import Context, RetryPolicy, StepFailed
from durable_sandbox.workflows.agents.core import DurableAgentRun, current_run

InvokeModelStage: Any
try:  # strands with middleware
    from strands.middleware import InvokeModelStage
except ImportError:  # pragma: no cover - older strands: agent.model is wrapped for the invocation instead
    InvokeModelStage = None

_INSTALLED = "_durable_sandbox_installed"


class StrandsInterruptUnsupported(RuntimeError):
    pass


class RecordedModelError(RuntimeError):
    """A model error replayed from the journal whose original type is not a strands exception."""


def _model_error(exc: StepFailed) -> BaseException:
    """The exception strands sees for a failed model call: the original one when it just happened, a
    strands exception of the recorded type when replayed (so strands reacts the same way, e.g. a
    throttling error is retried by its event loop), else a :class:`RecordedModelError`."""
    if exc.__cause__ is not None:
        return exc.__cause__
    exceptions = importlib.import_module("strands.types.exceptions")
    cls = getattr(exceptions, exc.error_type, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(exc.cause_message)
        except Exception:  # pragma: no cover - an exception with another constructor
            pass
    return RecordedModelError(f"{exc.error_type}: {exc.cause_message}")


def _tool_use_ids(events: list[Any]) -> list[str]:
    """toolUseIds in the order a model response requested them."""
    ids: list[str] = []
    for ev in events:
        if not isinstance(ev, dict):
            continue
        start = (ev.get("contentBlockStart") or {}).get("start") or {}
        delta = (ev.get("contentBlockDelta") or {}).get("delta") or {}
        for block in (start.get("toolUse"), delta.get("toolUse")):
            if isinstance(block, dict) and block.get("toolUseId") and block["toolUseId"] not in ids:
                ids.append(block["toolUseId"])
    return ids


def _request(messages: Any, tool_specs: Any, system_prompt: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": messages,
        "system": system_prompt,
        "tools": sorted(str(s.get("name")) for s in (tool_specs or []) if isinstance(s, dict)),
        "toolChoice": kwargs.get("tool_choice"),
    }


class DurableModel(Model):
    """A strands ``Model`` that journals each call of the wrapped model as one step.

    Outside an active :class:`DurableAgentRun` (no ``invoke`` in progress) it passes calls straight through.
    """

    def __init__(self, inner: Model, run: DurableAgentRun | None = None) -> None:
        self.inner = inner
        self._run = run

    # configuration and everything else: the wrapped model's
    def update_config(self, **model_config: Any) -> None:
        self.inner.update_config(**model_config)

    def get_config(self) -> Any:
        return self.inner.get_config()

    @property
    def stateful(self) -> bool:
        return bool(getattr(self.inner, "stateful", False))

    async def count_tokens(self, *args: Any, **kwargs: Any) -> int:
        return await self.inner.count_tokens(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _active(self) -> DurableAgentRun | None:
        return self._run or current_run()

    async def stream(
        self,
        messages: Any,
        tool_specs: Any = None,
        system_prompt: Any = None,
        **kwargs: Any,
    ) -> AsyncGenerator[Any, None]:
        def settle(run: DurableAgentRun, events: list[Any]) -> list[Any]:
            run.plan_tools(_tool_use_ids(events))
            return events

        async for event in self._model_events(
            lambda: self.inner.stream(messages, tool_specs, system_prompt, **kwargs),
            lambda: _request(messages, tool_specs, system_prompt, kwargs), settle=settle,
        ):
            yield event

    async def structured_output(
        self, output_model: Any, prompt: Any, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        def settle(run: DurableAgentRun, events: list[Any]) -> list[Any]:
            return [{**event, "output": output_model.model_validate(event["output"])}
                    if isinstance(event, dict) and "output" in event and isinstance(event["output"], dict) else event
                    for event in events]

        async for event in self._model_events(
            lambda: self.inner.structured_output(output_model, prompt, system_prompt, **kwargs),
            lambda: {"messages": prompt, "system": system_prompt, "output": getattr(output_model, "__qualname__", None)},
            settle=settle, name="structured_output",
        ):
            yield event

    async def _model_events(
        self,
        produce: Callable[[], AsyncIterable[Any]],
        request: Callable[[], Any],
        *,
        settle: Callable[[DurableAgentRun, list[Any]], list[Any]],
        name: str = "model",
    ) -> AsyncGenerator[Any, None]:
        """The wrapped model's events: streamed straight through outside an active run; inside one, collected
        as one journaled model call (``request`` digested for the replay check), then ``settle``d (recorded and
        replayed events alike) and yielded."""
        run = self._active()
        if run is None:
            async for event in produce():
                yield event
            return

        async def call() -> list[Any]:
            return [e async for e in produce()]

        try:
            events = await run.model_call(call, request=request(), name=name)
        except StepFailed as exc:
            raise _model_error(exc) from None
        for event in settle(run, events):
            yield event


class DurableTool(AgentTool):
    """A strands ``AgentTool`` that runs the wrapped tool as step ``<agent-id>/tool/<n>-<name>``."""

    def __init__(self, inner: AgentTool, run: DurableAgentRun) -> None:
        super().__init__()
        self.inner = inner
        self.run = run

    @property
    def tool_name(self) -> str:
        return self.inner.tool_name

    @property
    def tool_spec(self) -> Any:
        return self.inner.tool_spec

    @property
    def tool_type(self) -> str:
        return self.inner.tool_type

    @property
    def supports_hot_reload(self) -> bool:
        return self.inner.supports_hot_reload

    def get_display_properties(self) -> dict[str, str]:
        return self.inner.get_display_properties()

    async def stream(self, tool_use: Any, invocation_state: dict[str, Any], **kwargs: Any) -> AsyncGenerator[Any, None]:
        live: list[Any] = []  # progress events of a live call, re-emitted after its result is committed

        async def call() -> Any:
            last: Any = None
            seen = False
            async for event in self.inner.stream(tool_use, invocation_state, **kwargs):
                if isinstance(event, ToolInterruptEvent):
                    raise StrandsInterruptUnsupported(
                        f"Tool {tool_use.get('name')!r} raised a strands interrupt; inside a durable agent "
                        f"use ctx.callback(...) for human input (current_run().ctx is the run's context)."
                    )
                if isinstance(event, ToolResultEvent):
                    return event.tool_result
                live.append(event if isinstance(event, ToolStreamEvent) else ToolStreamEvent(tool_use, event))
                last, seen = event, True
            if not seen:
                return {
                    "toolUseId": str(tool_use.get("toolUseId")),
                    "status": "error",
                    "content": [{"text": f"Tool '{tool_use.get('name')}' did not return a result"}],
                }
            return last

        result = await self.run.tool_call(
            str(tool_use.get("name")), call, call_id=tool_use.get("toolUseId"), input=tool_use.get("input")
        )
        for event in live:
            yield event
        yield ToolResultEvent(result)


def _install(agent: Any, *, via_middleware: bool) -> None:
    """Register the journaling hook and model wrapper on ``agent`` once; inert outside ``invoke``."""
    if getattr(agent, _INSTALLED, False):
        return

    def journal_tool(event: BeforeToolCallEvent) -> None:
        run = current_run()
        if run is None or event.selected_tool is None or isinstance(event.selected_tool, DurableTool):
            return
        event.selected_tool = DurableTool(event.selected_tool, run)

    try:
        from strands.hooks.registry import HookOrder

        agent.add_hook(journal_tool, BeforeToolCallEvent, order=HookOrder.SDK_LAST)
    except (ImportError, TypeError):  # pragma: no cover - strands without hook ordering
        agent.hooks.add_callback(BeforeToolCallEvent, journal_tool)

    if via_middleware:

        def journal_model(context: Any) -> Any:
            if current_run() is None or isinstance(context.model, DurableModel):
                return context
            return context.replace(model=DurableModel(context.model))

        agent.add_middleware(InvokeModelStage.Input, journal_model)
    setattr(agent, _INSTALLED, True)


class DurableStrandsAgent:
    """A strands ``Agent`` whose invocations are journaled in a durable run.

    Build the ``Agent`` inside the workflow function (a resumed run re-creates it and replays its
    conversation from the journal); keyword options are those of :class:`DurableAgentRun`.
    """

    def __init__(
        self,
        agent: Any,
        *,
        model_retry: RetryPolicy | None = None,
        model_timeout: float | None = None,
        tool_retry: RetryPolicy | None = None,
        tool_timeout: float | None = None,
        check_input: bool = True,
        use_middleware: bool | None = None,
    ) -> None:
        self.agent = agent
        self.options: dict[str, Any] = {
            "model_retry": model_retry,
            "model_timeout": model_timeout,
            "tool_retry": tool_retry,
            "tool_timeout": tool_timeout,
            "check_input": check_input,
        }
        if use_middleware is None:
            use_middleware = InvokeModelStage is not None and hasattr(agent, "add_middleware")
        self.use_middleware = use_middleware
        _install(agent, via_middleware=use_middleware)

    async def invoke(self, ctx: Context, agent_id: str, prompt: Any = None, **kwargs: Any) -> Any:
        """``agent.invoke_async(prompt, **kwargs)`` with its model and tool calls journaled under ``agent_id``."""
        run = DurableAgentRun(ctx, agent_id, **self.options)
        token = run.activate()
        swapped = None
        if not self.use_middleware and not isinstance(self.agent.model, DurableModel):
            swapped = self.agent.model
            self.agent.model = DurableModel(swapped)
        try:
            result = await self.agent.invoke_async(prompt, **kwargs)
        except BaseException:
            if run.aborted is not None:
                raise run.aborted from None
            raise
        finally:
            if swapped is not None:
                self.agent.model = swapped
            run.deactivate(token)
        # A crash, suspension or cancellation inside a tool that strands ran in a task of its own: strands
        # may have carried on without the tool's result; nothing after it was journaled. Surface it now.
        run.check()
        return result


async def invoke_agent(ctx: Context, agent_id: str, agent: Any, prompt: Any = None, **kwargs: Any) -> Any:
    """Shorthand for ``DurableStrandsAgent(agent).invoke(ctx, agent_id, prompt, **kwargs)``."""
    return await DurableStrandsAgent(agent).invoke(ctx, agent_id, prompt, **kwargs)


__all__ = [
    "DurableModel",
    "DurableStrandsAgent",
    "DurableTool",
    "RecordedModelError",
    "StrandsInterruptUnsupported",
    "invoke_agent",
]
