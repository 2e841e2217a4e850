"""An example team's workflows, executed by the team's own workers (examples/worker/Dockerfile).

A Workflow names them by ``entrypoint: team_flows:triage`` and ``worker: {queue: agents}``. ``triage`` is
``versioning="auto-upgrade"``: it guards its changes with ``ctx.patched``, so a worker of a newer build may take
over a run an older build started (replaying the old history down the old path). Without that a run stays with
the build that started it."""

from __future__ import annotations

from typing import Any

import durable_sandbox


def classify(text: str) -> str:
    return "bug" if "error" in text.lower() else "question"


def route(label: str) -> str:
    return {"bug": "oncall", "question": "support"}[label]


def route_with_priority(label: str, text: str) -> str:
    return f"{route(label)}{'-urgent' if 'urgent' in text.lower() else ''}"


@durable_sandbox.workflow(versioning="auto-upgrade")
async def triage(ctx: durable_sandbox.Context, inp: dict[str, Any]) -> dict[str, str]:
    text = str(inp["text"])
    label = await ctx.step("classify", classify, text)
    # Build v2 added priorities. A run build v1 started past this point keeps v1's path on replay.
    if ctx.patched("priority"):
        queue = await ctx.step("route-priority", route_with_priority, label, text)
    else:
        queue = await ctx.step("route", route, label)
    return {"label": label, "queue": queue}
