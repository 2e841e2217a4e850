"""A planner that delegates: the plan step returns work packages, each a child workflow of its own (its own run,
journal and sandbox; in a cluster its own Workflow object, owned by the planner's), then a critic step reads
their results. A package whose input says ``wait`` holds its sandbox until its ``go`` callback is signalled.

    dsb run examples.flows.delegation:delegating_planner --input '{"goal": "billing page", "areas": ["api", "ui"]}'

In a cluster (`dsb operator --workflows examples.flows`), `kubectl get dwf -l durable-sandbox.dev/parent=<name>`
lists the children (docs/kubernetes.md, "Child workflows").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import durable_sandbox
from examples.flows._effects import record


class Package(BaseModel):
    id: str
    title: str
    log: str | None = None
    wait: bool = False  # hold the sandbox until the `go` callback is signalled


class DelegationInput(BaseModel):
    goal: str
    areas: list[str] = Field(default_factory=lambda: ["api", "ui", "data"])
    log: str | None = None
    wait: list[str] = Field(default_factory=list)  # areas whose package waits for its `go` callback


def plan(params: DelegationInput) -> list[dict[str, Any]]:
    record(params.log, "plan")
    return [Package(id=a, title=f"{params.goal}: {a}", log=params.log, wait=a in params.wait).model_dump()
            for a in params.areas]


def critique(done: list[dict[str, Any]], log: str | None) -> str:
    record(log, "critic")
    return f"{len(done)} package(s) delivered"


@durable_sandbox.workflow(name="work-package")
async def work_package(ctx: durable_sandbox.Context, package: Package) -> dict[str, Any]:
    """One package, in a sandbox of its own."""
    async with ctx.sandbox("workspace", provider="local") as sbx:
        await sbx.write_file("task.txt", package.title)
        if package.wait:
            await ctx.callback("go")
        out = await sbx.shell("cat task.txt")
    return {"id": package.id, "deliverable": out.stdout}


@durable_sandbox.workflow(name="delegating-planner")
async def delegating_planner(ctx: durable_sandbox.Context, params: DelegationInput) -> dict[str, Any]:
    packages = await ctx.step("plan", plan, params)
    handles = [await ctx.start_child(work_package, p, id=p["id"]) for p in packages]
    done = await ctx.parallel("join", [h.join for h in handles])
    verdict = await ctx.step("critic", critique, done, params.log)
    return {"goal": params.goal, "done": done, "verdict": verdict}
