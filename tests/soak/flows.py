"""The entrypoint workflow the soak runs: steps with a side effect outside the run (a line appended to a host
file per execution), a durable timer, a callback answered through ``spec.signals``, and a sandbox session.

The operator imports it with ``--workflows tests.soak.flows``; the soak counts each step's executions in the
effects file against its journal (an execution beyond the recorded attempts is a committed step run twice)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import durable_sandbox


class SoakInput(BaseModel):
    effects: str = Field(min_length=1, description="Host file each step execution appends its id to.")
    nap_seconds: float = Field(ge=0, description="The durable timer between the first two steps.")
    provider: str | None = Field(default=None, description="Open a sandbox session on this provider, or none.")


def effect(path: str, step_id: str) -> str:
    with open(path, "a") as f:
        f.write(f"{step_id}\n")
    return step_id


@durable_sandbox.workflow
async def soak_flow(ctx: durable_sandbox.Context, params: SoakInput) -> dict[str, Any]:
    first = await ctx.step("s1", effect, params.effects, "s1")
    await ctx.sleep("nap", params.nap_seconds)
    second = await ctx.step("s2", effect, params.effects, "s2")
    approval = await ctx.callback("approval", {"after": [first, second]})
    lines = ""
    if params.provider is not None:
        async with ctx.sandbox("ws", provider=params.provider, snapshot_every=1) as sbx:
            # Marks, not appends: a call in flight when its worker died runs again (at least once).
            await sbx.shell(f"echo w1 >> {params.effects}; mkdir -p done; touch done/w1")
            out = await sbx.shell(f"echo w2 >> {params.effects}; touch done/w2; ls done")
            lines = out.stdout
    third = await ctx.step("s3", effect, params.effects, "s3")
    return {"steps": [first, second, third], "approval": approval, "work": lines}
