"""An agent that prepares a change in a sandbox, then waits (hours, days) for a human's approval.

The shape of a thousand agents waiting on approvals: while the run waits on the ``approve`` callback its
sandbox is hibernated (snapshotted and destroyed after ``hibernateAfterSeconds``; 0: at once), so nothing
runs and nothing is held; the signal restores it from the snapshot and the run finishes there.

    dsb run examples.flows.approval_gate:approval_gate --input '{"name": "fix-1"}' --run-id gate-1
    dsb signal gate-1 approve true && dsb resume gate-1

``effects`` (optional) is a file the sandbox calls append to: one line per executed call, so a test can
count executions (a call committed once and run twice would show twice).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import durable_sandbox


class GateInput(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    effects: str | None = None  # absolute path of a side-effect log outside the sandbox
    hibernate_after_seconds: float = Field(default=0.0, ge=0, alias="hibernateAfterSeconds")


@durable_sandbox.workflow
async def approval_gate(ctx: durable_sandbox.Context, params: GateInput) -> dict[str, Any]:
    log = f" >> {params.effects}" if params.effects else ""
    async with ctx.sandbox("workspace", provider="local", hibernate_after=params.hibernate_after_seconds) as sbx:
        await sbx.write_file("change.txt", f"change {params.name}\n")
        await sbx.shell(f"echo prepared {params.name}{log}")
        approved = await ctx.callback("approve", {"change": params.name})
        out = await sbx.shell(f"echo applied {params.name}{log}; cat change.txt")
    return {"approved": approved, "applied": out.stdout.strip().splitlines()[-1] if out.stdout else ""}
