"""A small code-first workflow: two steps, a parallel fan-out, and an optional approval callback.

    dsb run examples.flows.hello_flow:hello --input '{"name": "Ada"}'
    dsb run examples.flows.hello_flow:hello --input '{"name": "Ada", "approve": true}' --run-id hello-ada
    dsb signal hello-ada approval '{"approved": true, "by": "grace"}'
    dsb resume hello-ada
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, Field

import durable_sandbox


class HelloInput(BaseModel):
    name: str = Field(min_length=1)
    approve: bool = False  # wait for an `approval` signal before finishing
    shout: bool = False


def greeting(name: str, shout: bool) -> str:
    text = f"Hello, {name}!"
    return text.upper() if shout else text


def letters(word: str) -> int:
    return sum(ch.isalpha() for ch in word)


@durable_sandbox.workflow
async def hello(ctx: durable_sandbox.Context, params: HelloInput) -> dict[str, Any]:
    text = await ctx.step("greet", greeting, params.name, params.shout)
    ctx.progress("greeted", percent=40)
    words = text.split()
    # Each branch is checkpointed on its own: a resumed run only redoes unfinished ones.
    counts = await ctx.parallel("count", {str(i): functools.partial(letters, w) for i, w in enumerate(words)})
    ctx.progress("counted", percent=70)
    result: dict[str, Any] = {"greeting": text, "letters": sum(counts.values())}
    if params.approve:
        # The run stops here (dsb run exits 3) until `dsb signal RUN approval '<json>'` and `dsb resume RUN`.
        result["approval"] = await ctx.callback("approval", {"question": f"Send {text!r}?"})
    ctx.progress("done", percent=100)
    return result
