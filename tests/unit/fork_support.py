"""The workflows of the fork tests (tests/unit/test_forks.py), importable by their child process
(tests/unit/fork_child.py) and by `dsb run tests.unit.fork_support:...`."""

from __future__ import annotations

from typing import Any

from durable_sandbox import Context, workflow


@workflow(name="fork-counter")
async def counter(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox("sandbox", provider="local", snapshot_every=spec.get("every", 0),
                           keep_checkpoints=True) as sbx:
        counts = []
        for i in range(spec["calls"]):
            command = "date +%s%N" if spec.get("clock_at") == i else f"echo {i} >> log.txt; wc -l < log.txt"
            policy = spec.get("policies", {}).get(str(i), "rerun")
            counts.append((await sbx.shell(command, on_replay=policy)).stdout.strip())
        await ctx.callback("done")
    return {"counts": counts}


@workflow(name="fork-counter-tail")
async def tail(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    """The source's first ``from`` calls, then a new tail."""
    async with ctx.sandbox("sandbox", provider="local", snapshot_every=10, keep_checkpoints=True) as sbx:
        for i in range(spec["calls"]):
            word = str(i) if i < spec["from"] else f"tail{i}"
            await sbx.shell(f"echo {word} >> log.txt; wc -l < log.txt")
        log = (await sbx.read_file("log.txt")).stdout
    return {"log": log}
