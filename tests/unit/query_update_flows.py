"""Workflows of the query and update tests, importable by reference so that a `dsb` process (a fault point
SIGKILLs it) answers their queries and applies their updates too.

Every step appends ``<name>`` to the log file the input names (tests/unit/composition_flows.py's ``effect``):
a test counts each execution of a step's body from the file, not from the engine's word."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from durable_sandbox.engine import workflow
from tests.unit.composition_flows import effect


class Add(BaseModel):
    amount: int = Field(gt=0, description="How much to add (positive).")
    note: str = ""


def not_thirteen(add: Add) -> bool:
    if add.amount == 13:
        raise ValueError("13 is not added here; send another amount")
    return True


def seen(log: str, name: str, total: int) -> int:
    effect(log, name)
    return total


@workflow(name="qu-counter")
async def counter(ctx: Any, inp: dict[str, Any]) -> dict[str, Any]:
    """A total that updates add to and queries read; its steps record the total they saw (their input), so a
    replay that applied an update at another point would be a NonDeterminismError."""
    state: dict[str, Any] = {"total": int(inp.get("start", 0)), "added": []}
    ctx.query_handler("total", lambda: state["total"])

    @ctx.query_handler("added")
    def added(last: int) -> list[int]:
        return list(state["added"][-last:]) if last > 0 else []

    @ctx.update_handler("add", validator=not_thirteen)
    def add(a: Add) -> int:
        state["total"] += a.amount
        state["added"].append(a.amount)
        return int(state["total"])

    @ctx.update_handler("reset")
    def reset() -> int:
        state["total"] = 0
        return 0

    await ctx.step("first", seen, inp["log"], "first", state["total"])
    await ctx.callback("more")
    await ctx.step("second", seen, inp["log"], "second", state["total"])
    await ctx.callback("done")
    return {"total": state["total"], "added": state["added"]}
