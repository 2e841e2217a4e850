"""A scripted strands ``Model`` for tests and examples: predetermined responses, no network.

The response for a call is chosen by the conversation, not by a call counter: response ``i`` answers
the conversation that already holds ``i`` assistant messages. So a resumed run, whose earlier model
calls are replayed from the journal without reaching the model, gets the right next response.

A response is a string (final text), or ``{"text": ..., "tool_calls": [{"name", "input", "id"?}]}``,
or a callable ``messages -> response``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from strands.models.model import Model

Response = str | dict[str, Any]


def response_events(response: Response, turn: int) -> list[dict[str, Any]]:
    """The strands stream events (Bedrock ConverseStream shape) of one scripted response."""
    if isinstance(response, str):
        response = {"text": response}
    events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
    if response.get("text"):
        events += [
            {"contentBlockStart": {"start": {}}},
            {"contentBlockDelta": {"delta": {"text": response["text"]}}},
            {"contentBlockStop": {}},
        ]
    calls = response.get("tool_calls") or []
    for i, call in enumerate(calls):
        use_id = call.get("id") or f"tooluse-{turn}-{i}"
        events += [
            {"contentBlockStart": {"start": {"toolUse": {"name": call["name"], "toolUseId": use_id}}}},
            {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(call.get("input") or {})}}}},
            {"contentBlockStop": {}},
        ]
    events.append({"messageStop": {"stopReason": "tool_use" if calls else "end_turn"}})
    events.append({"metadata": {"usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}, "metrics": {"latencyMs": 1}}})
    return events


class ScriptedModel(Model):
    """Answers from a script; ``calls`` counts the calls that really reached it (replays do not)."""

    def __init__(self, script: Sequence[Response] | Callable[[list[Any]], Response], *, on_call: Callable[[int], None] | None = None) -> None:
        self.script = script
        self.calls = 0
        self.on_call = on_call
        self.config: dict[str, Any] = {"model_id": "scripted"}

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> Any:
        return self.config

    def structured_output(self, output_model: Any, prompt: Any, system_prompt: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError("ScriptedModel does not implement structured_output")

    async def stream(self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any) -> AsyncGenerator[Any, None]:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        self.calls += 1
        if self.on_call is not None:
            self.on_call(turn)
        if callable(self.script):
            response = self.script(list(messages))
        else:
            if turn >= len(self.script):
                raise IndexError(f"ScriptedModel has {len(self.script)} responses; turn {turn} has none")
            response = self.script[turn]
        for event in response_events(response, turn):
            yield event


__all__ = ["ScriptedModel", "response_events"]
