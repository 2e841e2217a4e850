"""Workflows of the composition tests (child workflows, continue-as-new), importable by reference so that a
process other than the test's (tests/unit/compose_worker.py, a `dsb` process) runs them too.

Every step appends ``<name>`` to the log file the input names (O_APPEND, one line per write, from any process):
a test counts each execution of a step's body from the file, not from the engine's word."""

from __future__ import annotations

import functools
import os
from typing import Any

from durable_sandbox.engine import workflow


def effect(log: str, name: str) -> str:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{name}\n".encode())
    finally:
        os.close(fd)
    return name.upper()


def fail(log: str, name: str) -> str:
    effect(log, name)
    raise ValueError(f"{name} cannot do it")


@workflow(name="compose-specialist")
async def specialist(ctx: Any, inp: dict[str, Any]) -> dict[str, Any]:
    done = await ctx.step("work", effect, inp["log"], f"work:{inp['package']}")
    if inp.get("wait"):
        await ctx.callback("approve")
    if inp.get("fail"):
        await ctx.step("fail", fail, inp["log"], f"fail:{inp['package']}")
    return {"package": inp["package"], "done": done}


@workflow(name="compose-planner")
async def planner(ctx: Any, inp: dict[str, Any]) -> dict[str, Any]:
    """A plan step, one child per work package (fanned out with ctx.parallel), then a critic step."""
    log = inp["log"]
    plan = await ctx.step("plan", lambda: [f"p{i}" for i in range(inp.get("n", 3))])

    async def package(pkg: str, ctx: Any) -> Any:
        extra = {k: True for k in ("wait", "fail") if pkg in inp.get(k, [])}
        return await ctx.child_workflow(specialist, {"log": log, "package": pkg, **extra}, id="child")

    done = await ctx.parallel("work", {pkg: functools.partial(package, pkg) for pkg in plan})
    verdict = await ctx.step("critic", effect, log, "critic")
    return {"done": done, "verdict": verdict}


@workflow(name="compose-start-then-join")
async def start_then_join(ctx: Any, inp: dict[str, Any]) -> list[Any]:
    handles = [await ctx.start_child(specialist, {"log": inp["log"], "package": f"s{i}"}, id=f"pkg-{i}")
               for i in range(inp.get("n", 2))]
    return await ctx.parallel("join", [h.join for h in handles])


@workflow(name="compose-one-child")
async def one_child(ctx: Any, inp: dict[str, Any]) -> Any:
    before = await ctx.step("before", effect, inp["log"], "before")
    child = await ctx.child_workflow(
        specialist, {"log": inp["log"], "package": "only", **inp.get("child", {})}, id="only",
        policy=inp.get("policy", "cancel"),
    )
    after = await ctx.step("after", effect, inp["log"], "after")
    return {"before": before, "child": child, "after": after}


@workflow(name="compose-grandparent")
async def grandparent(ctx: Any, inp: dict[str, Any]) -> Any:
    return await ctx.child_workflow(one_child, inp, id="middle")


@workflow(name="compose-counter")
async def counter(ctx: Any, inp: dict[str, Any]) -> dict[str, Any]:
    """One step per run, then continue as new until ``rounds`` runs have counted."""
    n = inp.get("n", 0)
    await ctx.step("count", effect, inp["log"], f"count:{n}")
    if n + 1 < inp["rounds"]:
        await ctx.continue_as_new({**inp, "n": n + 1})
    return {"counted": n + 1}


@workflow(name="compose-session-agent")
async def session_agent(ctx: Any, inp: dict[str, Any]) -> dict[str, Any]:
    """An agent's session that continues as new every ``per_run`` calls, carrying its sandbox: each call appends
    a line to a file in the workspace, so the last run sees every call any run of the chain made."""
    i, total = inp.get("i", 0), inp["total"]
    async with ctx.sandbox("ws", provider="local", snapshot_every=inp.get("snapshot_every", 0)) as sbx:
        sandbox = sbx.handle.id if sbx.handle else None
        for _ in range(inp["per_run"]):
            if i >= total:
                break
            await sbx.shell(f"echo call-{i} >> calls.txt", operation_id=f"c{i}")
            i += 1
        if i < total:
            await ctx.continue_as_new({**inp, "i": i})
        listed = await sbx.shell("cat calls.txt", operation_id="final")
    return {"lines": listed.stdout.split(), "sandbox": sandbox}


@workflow(name="compose-continuing-child")
async def continuing_child_parent(ctx: Any, inp: dict[str, Any]) -> Any:
    return await ctx.child_workflow(counter, {"log": inp["log"], "rounds": 3}, id="counter")
