"""Workflows a cluster worker executes in the unit tests (importable by path, as a team's module is)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import durable_sandbox

# gate name -> (reached: set when step 1 runs, opened: what step 1 waits for); the test makes them
GATES: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}


def _append(path: str, line: str) -> None:
    with Path(path).open("a") as f:
        f.write(line)


async def _mark(log: str, i: int, gate: str | None) -> int:
    """The step's side effect: one line in ``log`` per execution; step 1 waits for its gate to open first."""
    _append(log, f"s{i}\n")
    if gate is not None and i == 1:
        reached, opened = GATES[gate]
        reached.set()
        await opened.wait()
    return i


@durable_sandbox.workflow(name="worker-steps")
async def steps(ctx: durable_sandbox.Context, inp: dict[str, Any]) -> dict[str, Any]:
    done: list[int] = []
    for i in range(int(inp["steps"])):
        done.append(await ctx.step(f"s{i}", _mark, inp["log"], i, inp.get("gate")))
    return {"done": done}
