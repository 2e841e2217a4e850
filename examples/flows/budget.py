"""A long-lived run that people steer while it waits: queries read its state, updates change it.

    dsb run examples.flows.budget:budget --input '{"limit": 10}' --run-id budget-1
    dsb query budget-1 remaining
    dsb update budget-1 raise --input '{"amount": 5, "reason": "incident grew"}' --id raise-1
    dsb signal budget-1 finish true && dsb resume budget-1

``remaining`` and ``status`` are queries: answered from the run's journal, replayed read-only (nothing is
executed or written). ``raise`` is an update: its input is validated (``Raise``: a positive amount of at most
1000), it is journaled before its answer is returned, and the same ``--id`` again returns the recorded answer
instead of raising the limit twice.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import durable_sandbox


class BudgetInput(BaseModel):
    limit: int = Field(ge=0, description="What the run may spend.")


class Raise(BaseModel):
    amount: int = Field(gt=0, le=1000)
    reason: str = ""


def spend(cost: int) -> int:
    return cost


@durable_sandbox.workflow
async def budget(ctx: durable_sandbox.Context, params: BudgetInput) -> dict[str, Any]:
    state: dict[str, Any] = {"limit": params.limit, "spent": 0, "raises": []}
    ctx.query_handler("remaining", lambda: state["limit"] - state["spent"])
    ctx.query_handler("status", lambda: dict(state))

    @ctx.update_handler("raise")
    def raise_limit(r: Raise) -> int:
        state["limit"] += r.amount
        state["raises"].append({"amount": r.amount, "reason": r.reason})
        return int(state["limit"] - state["spent"])

    state["spent"] += await ctx.step("triage", spend, 3)
    await ctx.callback("finish")  # waits (days) for a human; queries and updates reach it meanwhile
    state["spent"] += await ctx.step("remediate", spend, min(8, state["limit"] - state["spent"]))
    return state
