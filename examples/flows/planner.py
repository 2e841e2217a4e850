"""Planner / specialists / critic: the planner turns a goal into a list of work packages at run time,
one specialist per package works in parallel, a critic finds the gaps and only the missing work is
done. After a partial failure, resuming the failed run re-runs only the branch that failed.

    dsb run examples.flows.planner:planner --input '{"goal": "launch the billing page", "areas": ["api", "ui"]}'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import durable_sandbox
from examples.flows._effects import record


class PlannerInput(BaseModel):
    goal: str
    areas: list[str] = Field(default_factory=lambda: ["api", "ui", "data"])
    required: list[str] = Field(default_factory=lambda: ["api", "ui", "data", "docs", "security"])
    log: str | None = None
    fail_once: list[str] = Field(default_factory=list)  # package ids whose specialist fails the first time
    marker_dir: str | None = None  # where "already failed once" markers live


def plan(goal: str, areas: list[str], log: str | None) -> list[dict[str, Any]]:
    """The planner: a runtime-generated list of work packages (here from the input; an LLM in real life)."""
    record(log, "plan")
    return [{"id": area, "title": f"{goal}: {area}", "specialist": f"{area}-specialist"} for area in areas]


def draft(package: dict[str, Any], log: str | None, fail_once: list[str], marker_dir: str | None) -> str:
    record(log, f"draft:{package['id']}")
    if package["id"] in fail_once and marker_dir:
        marker = Path(marker_dir) / f"failed-{package['id']}"
        if not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError(f"specialist for {package['id']!r} crashed")
    return f"draft of {package['title']}"


def polish(package: dict[str, Any], text: str, log: str | None) -> dict[str, Any]:
    record(log, f"polish:{package['id']}")
    return {"id": package["id"], "deliverable": text.replace("draft", "final")}


def critique(required: list[str], done: dict[str, Any], log: str | None) -> list[dict[str, Any]]:
    """The critic: which required areas does the work not cover yet?"""
    record(log, "critic")
    return [{"id": area, "title": f"gap: {area}", "specialist": f"{area}-specialist"} for area in required if area not in done]


def specialist(package: dict[str, Any], params: PlannerInput) -> Any:
    """A branch with its own scoped steps (`<parallel>/<id>/draft`, `.../polish`)."""

    async def branch(ctx: durable_sandbox.Context) -> dict[str, Any]:
        text = await ctx.step("draft", draft, package, params.log, params.fail_once, params.marker_dir)
        return await ctx.step("polish", polish, package, text, params.log)

    return branch


@durable_sandbox.workflow
async def planner(ctx: durable_sandbox.Context, params: PlannerInput) -> dict[str, Any]:
    packages = await ctx.step("plan", plan, params.goal, params.areas, params.log)
    done = await ctx.parallel("specialists", {p["id"]: specialist(p, params) for p in packages})
    gaps = await ctx.step("critic", critique, params.required, done, params.log)
    if gaps:
        done.update(await ctx.parallel("gap-fill", {p["id"]: specialist(p, params) for p in gaps}))
    return {"goal": params.goal, "packages": sorted(done), "gapsFilled": [g["id"] for g in gaps]}
