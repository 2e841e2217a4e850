"""Workflows the CLI tests run by reference (tests.unit.cli_flows:<name>), in-process and in subprocesses."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from pydantic import BaseModel

import durable_sandbox
from durable_sandbox import RetryPolicy


class Params(BaseModel):
    name: str
    times: int = 1


def _double(x: int) -> int:
    return 2 * x


def _explode() -> None:
    raise ValueError("kaboom")


@durable_sandbox.workflow
async def doubler(ctx: durable_sandbox.Context, data: dict[str, Any] | None) -> dict[str, Any]:
    value = await ctx.step("double", _double, int((data or {}).get("x", 1)))
    ctx.progress("doubled", percent=100)
    return {"doubled": value}


@durable_sandbox.workflow
async def greet(ctx: durable_sandbox.Context, params: Params) -> str:
    return await ctx.step("greet", lambda: " ".join([f"hi {params.name}"] * params.times))


@durable_sandbox.workflow
async def boom(ctx: durable_sandbox.Context) -> None:
    await ctx.step("explode", _explode, retry=RetryPolicy(max_attempts=1))


@durable_sandbox.workflow
async def approval(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    prepared = await ctx.step("prepare", _double, int(data.get("x", 1)))
    verdict = await ctx.callback("approve", {"prepared": prepared})
    return {"prepared": prepared, "verdict": verdict}


@durable_sandbox.workflow
async def napper(ctx: durable_sandbox.Context, data: dict[str, Any]) -> str:
    await ctx.sleep("nap", float(data["seconds"]))
    return "rested"


def _provider_error() -> None:
    raise RuntimeError("Sandbox provider [e2b] needs an API key")


@durable_sandbox.workflow(name="[e2b] brackets")
async def brackets(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    """Brackets everywhere a user, a provider or a tool puts text: names, results, output, errors."""
    out = await ctx.step("[red]step[/red]", lambda: "[red]x[/red]")
    ctx.progress("[bold]half[/bold] :smile:", percent=50)
    async with ctx.sandbox("box", provider="local") as sbx:
        call = await sbx.shell("echo '[red]x[/red]'; echo '[e2b] err' >&2")
    if data.get("wait"):
        await ctx.callback("[cb]", {"q": "[red]x[/red]"})
    if data.get("fail"):
        await ctx.step("[fail]", _provider_error, retry=RetryPolicy(max_attempts=1))
    return {"out": out, "stdout": call.stdout}


@durable_sandbox.workflow
async def held(ctx: durable_sandbox.Context, data: dict[str, Any]) -> str:
    """Waits for a signal while its sandbox block is open: the run holds a sandbox (or its snapshot)."""
    async with ctx.sandbox("box", provider="local", snapshot_every=1) as sbx:
        await sbx.shell("echo kept > f.txt")
        verdict = await ctx.callback("go", None)
    return str(verdict)


def _filler(i: int, size: int) -> str:
    return f"{i}:" + "x" * size


@durable_sandbox.workflow
async def big_steps(ctx: durable_sandbox.Context, data: dict[str, Any]) -> dict[str, Any]:
    """Steps with big results (for filling a small disk)."""
    total = 0
    for i in range(int(data["n"])):
        total += len(await ctx.step(f"big-{i}", _filler, i, int(data["size"])))
    return {"steps": int(data["n"]), "bytes": total}


def _gate(flag: str, go: str) -> str:
    with open(flag, "a") as f:
        f.write("entered\n")
    while not os.path.exists(go):  # the step's own work: hold until the test opens the gate
        time.sleep(0.02)
    return "through"


@durable_sandbox.workflow
async def gated(ctx: durable_sandbox.Context, data: dict[str, Any]) -> str:
    """One step that holds until a file exists (tests of leases: a worker that is alive mid-step)."""
    return await ctx.step("gate", _gate, data["flag"], data["go"])


def _never_returns() -> None:
    threading.Event().wait()  # nothing sets it: only the step's timeout ends this step


@durable_sandbox.workflow
async def endless_step(ctx: durable_sandbox.Context, data: dict[str, Any]) -> str:
    """A plain function that never returns, under a step timeout (tests/unit/test_step_timeouts.py)."""
    await ctx.step("forever", _never_returns, timeout=float(data["timeout"]))
    return "unreachable"


# Plain annotations, checked like models (tests/unit/test_cli_input_types.py).


@durable_sandbox.workflow
async def named(ctx: durable_sandbox.Context, who: str) -> str:
    return await ctx.step("greet", lambda: f"hello {who}")


@durable_sandbox.workflow
async def counted(ctx: durable_sandbox.Context, n: int) -> int:
    return await ctx.step("count", lambda: n + 1)


@durable_sandbox.workflow
async def tagged(ctx: durable_sandbox.Context, tags: list[int] | None) -> int:
    return sum(tags or [])


@durable_sandbox.workflow
async def scored(ctx: durable_sandbox.Context, scores: dict[str, float]) -> float:
    return sum(scores.values())


@durable_sandbox.workflow
async def either(ctx: durable_sandbox.Context, key: int | str) -> str:
    return repr(key)


@durable_sandbox.workflow
async def anything(ctx: durable_sandbox.Context, data) -> str:  # unannotated: takes any JSON
    return repr(data)
