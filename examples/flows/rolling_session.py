"""An agent session that lives longer than one run: every ``perRun`` calls the run continues as new
(``ctx.continue_as_new``), carrying its live sandbox, so each run's journal stays bounded however long the
session goes on (issue 38, continue-as-new; docs/workflows.md *Continue-as-new*).

    dsb run examples.flows.rolling_session:rolling_session --input '{"total": 6, "perRun": 2}'

Each call appends a line to ``calls.txt`` in the workspace; the last run reads it back, so its result shows
every call of every run of the chain landed in one sandbox (``sandboxes``: the sandbox id each run worked in).
In the cluster the Workflow goes on from run to run of its chain (``status.runs``, docs/kubernetes.md)."""

from __future__ import annotations

from typing import Any

import durable_sandbox


@durable_sandbox.workflow(name="rolling-session")
async def rolling_session(ctx: Any, inp: dict[str, Any]) -> dict[str, Any]:
    done, total, per_run = inp.get("done", 0), inp["total"], inp["perRun"]
    async with ctx.sandbox("ws", provider="local") as sbx:
        sandboxes = [*inp.get("sandboxes", []), sbx.handle.id if sbx.handle else None]
        for _ in range(per_run):
            if done >= total:
                break
            await sbx.shell(f"echo call-{done} >> calls.txt", operation_id=f"call-{done}")
            done += 1
        if done < total:
            await ctx.continue_as_new({**inp, "done": done, "sandboxes": sandboxes})
        listed = await sbx.shell("cat calls.txt", operation_id="read-back")
    return {"calls": listed.stdout.split(), "sandboxes": sandboxes}
