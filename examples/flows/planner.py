"""Planner / specialists / critic, each work package a child workflow: the planner turns a goal into a list of work
packages at run time; each package goes to a specialist that is a run of its own (``ctx.start_child``: its own
journal, its own sandbox, started together and joined with ``ctx.parallel``); a critic finds the gaps and only
the missing work is delegated. After a crash, or a specialist that failed, resuming the run repeats only the
missing work: a child that completed is not run again (the parent's journal holds its result), a child cut
short goes on from its own journal, and a failed child is retried as the same run.

    dsb run examples.flows.planner:planner --input '{"goal": "launch the billing page", "areas": ["api", "ui"]}'

Each specialist's run id is the planner's, a dot and ``<stage>-<package>`` (``dsb inspect <run>.specialists-api``
shows its journal, the sandbox calls included); ``log`` (optional) is a side-effect log (examples/flows/_effects.py)
with one line per stage that really ran.
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


class WorkPackage(BaseModel):
    """What the planner hands a specialist (the child workflow's input)."""

    id: str
    title: str
    specialist: str
    log: str | None = None
    fail_once: bool = False
    marker_dir: str | None = None


def plan(goal: str, areas: list[str], log: str | None) -> list[dict[str, Any]]:
    """The planner: a runtime-generated list of work packages (here from the input; an LLM in real life)."""
    record(log, "plan")
    return [{"id": area, "title": f"{goal}: {area}", "specialist": f"{area}-specialist"} for area in areas]


def draft(package: WorkPackage) -> str:
    record(package.log, f"draft:{package.id}")
    if package.fail_once and package.marker_dir:
        marker = Path(package.marker_dir) / f"failed-{package.id}"
        if not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError(f"specialist for {package.id!r} crashed")
    return f"draft of {package.title}"


def polish(package: WorkPackage, text: str) -> dict[str, Any]:
    record(package.log, f"polish:{package.id}")
    return {"id": package.id, "deliverable": text.replace("draft", "final")}


def critique(required: list[str], done: dict[str, Any], log: str | None) -> list[dict[str, Any]]:
    """The critic: which required areas does the work not cover yet?"""
    record(log, "critic")
    return [{"id": area, "title": f"gap: {area}", "specialist": f"{area}-specialist"} for area in required
            if area not in done]


@durable_sandbox.workflow
async def specialist(ctx: durable_sandbox.Context, package: WorkPackage) -> dict[str, Any]:
    """One work package, a run of its own: it drafts, saves the draft in its own sandbox, polishes and saves the
    deliverable there too (each step and sandbox call journaled in this run, not in the planner's)."""
    async with ctx.sandbox("workspace", provider="local") as sbx:
        text = await ctx.step("draft", draft, package)
        await sbx.write_file(f"{package.id}.md", text, operation_id="save-draft")
        done = await ctx.step("polish", polish, package, text)
        await sbx.write_file(f"{package.id}.md", done["deliverable"], operation_id="save-final")
    return done


async def delegate(ctx: durable_sandbox.Context, stage: str, packages: list[dict[str, Any]],
                   params: PlannerInput) -> dict[str, Any]:
    """Start one specialist child per package (all at once), then join them; the results by package id."""
    handles = {}
    for p in packages:
        work = WorkPackage(**p, log=params.log, fail_once=p["id"] in params.fail_once, marker_dir=params.marker_dir)
        handles[p["id"]] = await ctx.start_child(specialist, work, id=f"{stage}-{p['id']}")
    joined: dict[str, Any] = await ctx.parallel(stage, {key: h.join for key, h in handles.items()})
    return joined


@durable_sandbox.workflow
async def planner(ctx: durable_sandbox.Context, params: PlannerInput) -> dict[str, Any]:
    packages = await ctx.step("plan", plan, params.goal, params.areas, params.log)
    done = await delegate(ctx, "specialists", packages, params)
    gaps = await ctx.step("critic", critique, params.required, done, params.log)
    if gaps:
        done.update(await delegate(ctx, "gap-fill", gaps, params))
    return {"goal": params.goal, "packages": sorted(done), "gapsFilled": [g["id"] for g in gaps]}
