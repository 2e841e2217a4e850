"""Workflows the web view's tests run: every kind of operation the run page's timeline draws."""

from __future__ import annotations

from typing import Any

import durable_sandbox
from durable_sandbox import RetryPolicy

ATTEMPTS: dict[str, int] = {}  # step key -> times it ran (the flaky step fails its first attempt)


def _flaky(key: str) -> str:
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] == 1:
        raise ConnectionError("the first attempt fails")
    return f"ok after {ATTEMPTS[key]} attempts"


def _secret_result() -> dict[str, Any]:
    # What a careless step might return: the view must mask it.
    return {"apiKey": "sk-live-do-not-show", "inputTokens": 12, "url": "https://user:pw@example.invalid/x?token=abc"}


@durable_sandbox.workflow(name="ui-everything")
async def everything(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    flaky = await ctx.step("flaky", _flaky, str(data["key"]), retry=RetryPolicy(max_attempts=3, initial_interval=0.01,
                                                                                  jitter=False))
    secret = await ctx.step("secret", _secret_result)
    await ctx.sleep("nap", 0.01)  # a durable timer short enough to be waited inline

    async def branch(c: durable_sandbox.Context) -> int:
        await c.step("inner", lambda: 1)
        return 1

    fanned = await ctx.parallel("fan", {"left": branch, "right": branch})
    async with ctx.sandbox("ws", provider="local", snapshot_every=2, inject_loss_after=3) as sbx:
        await sbx.write_file("a.txt", "one\n")
        await sbx.shell("echo two >> a.txt")
        await sbx.shell("echo three >> a.txt")
        out = await sbx.shell("cat a.txt")
    verdict = await ctx.callback("approve", {"question": "ship it?", "env": {"TOKEN": "do-not-show"}})
    return {"flaky": flaky, "secret": secret, "fanned": fanned, "out": out.stdout, "verdict": verdict}


@durable_sandbox.workflow(name="ui-held")
async def held(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    """A loss and a recovery, then a wait inside the sandbox block: its newest snapshot stays live."""
    async with ctx.sandbox("ws", provider="local", snapshot_every=2, inject_loss_after=3) as sbx:
        for n in range(4):
            await sbx.shell(f"echo {n} >> n.txt")
        verdict = await ctx.callback("approve", {"question": "go on?"})
        out = await sbx.shell("cat n.txt")
    return {"out": out.stdout, "verdict": verdict}


@durable_sandbox.workflow(name="ui-cut")
async def cut(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    """Two calls with ids of their own, so a test can interrupt the second (``before:ws/second``)."""
    async with ctx.sandbox("ws", provider="local") as sbx:
        await sbx.shell("echo one", operation_id="first")
        out = await sbx.shell("echo two", operation_id="second")
    return {"out": out.stdout}
