"""An agent whose tools edit files in the run's sandbox (issue 35 item 6), with every sandbox call the provider
executes logged to a file outside the sandbox, so that tests in this process and in killed child processes count
what really ran, and where.

    python -m tests.unit.agent_sandbox_support <db> <run_id> <effects log> <provider home> <params json>

runs the workflow in a child process (a test sets DURABLE_SANDBOX_FAULT so that it is killed)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from strands import Agent, tool

import durable_sandbox
from durable_sandbox.providers.contract import SandboxHandle, ToolCall, ToolResult
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes.session import SandboxSession
from durable_sandbox.stores import SqliteStore
from durable_sandbox.workflows.agents import DurableAgentRun
from durable_sandbox.workflows.agents.scripted import ScriptedModel
from durable_sandbox.workflows.agents.strands import DurableStrandsAgent

SESSION = "ws"
# Response 1 asks for two tools at once: strands runs them concurrently (its default executor).
SCRIPT: list[Any] = [
    {"tool_calls": [{"name": "edit", "input": {"path": "a.txt", "text": "alpha"}, "id": "t1"},
                    {"name": "edit", "input": {"path": "b.txt", "text": "beta"}, "id": "t2"}]},
    {"tool_calls": [{"name": "append", "input": {"path": "a.txt", "text": "more"}, "id": "t3"}]},
    {"tool_calls": [{"name": "build", "input": {}, "id": "t4"}]},
    "Done: a and b edited, built.",
]
# The workspace as the run leaves it: every file with its contents, in name order.
LISTING = 'for f in $(ls | sort); do echo "== $f"; cat "$f"; done'


class LoggingProvider(LocalProvider):
    """A LocalProvider that logs every call it executed (operation id, sandbox); not an attempt on a sandbox that
    is gone (refused before anything ran)."""

    def __init__(self, home: str | Path, log: str | Path) -> None:
        super().__init__(home)
        self.log = Path(log)

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        result = await super().execute(handle, call)
        with self.log.open("a") as f:
            f.write(json.dumps({"op": call.operation_id, "sandbox": handle.id}) + "\n")
        return result


def executed(log: str | Path) -> list[dict[str, str]]:
    p = Path(log)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def make_tools(sbx: SandboxSession) -> list[Any]:
    @tool
    async def edit(path: str, text: str) -> str:
        """Write a file, then note the edit beside it (concurrent edits: the workspace does not depend on their order)."""
        await sbx.write_file(path, text + "\n")
        await sbx.shell(f"echo 'edited {path}' > {path}.note")
        return f"edited {path}"

    @tool
    async def append(path: str, text: str) -> str:
        """Append a line to a file and read it back."""
        await sbx.shell(f"echo '{text}' >> {path}")
        await sbx.shell(f"echo 'appended {path}' >> history")
        return (await sbx.read_file(path)).stdout

    @tool
    async def build() -> str:
        """Concatenate the files."""
        result = await sbx.shell("cat a.txt b.txt > out.txt && wc -l < out.txt")
        return result.stdout.strip()

    return [edit, append, build]


@durable_sandbox.workflow(name="tests.agent-sandbox-tools")
async def agent_tools_flow(ctx: durable_sandbox.Context, params: dict[str, Any]) -> dict[str, Any]:
    async with ctx.sandbox(SESSION, provider="local", snapshot_every=params.get("snapshot_every", 0),
                           inject_loss_after=params.get("inject_loss_after")) as sbx:
        agent = Agent(model=ScriptedModel(SCRIPT), tools=make_tools(sbx), callback_handler=None)
        answer = await DurableStrandsAgent(agent).invoke(ctx, "coder", "Edit a and b, then build.")
        listing = await sbx.shell(LISTING)
    return {"answer": str(answer).strip(), "workspace": listing.stdout}


@durable_sandbox.workflow(name="tests.agent-sandbox-loop")
async def hand_written_loop(ctx: durable_sandbox.Context, params: dict[str, Any]) -> dict[str, Any]:
    """A hand-written loop on ``DurableAgentRun`` whose tools call the sandbox (no model: the plan is fixed)."""
    async with ctx.sandbox(SESSION, provider="local", inject_loss_after=params.get("inject_loss_after")) as sbx:
        run = DurableAgentRun(ctx, "loop")

        async def write(n: int) -> str:
            await sbx.shell(f"echo {n} >> counter")
            return (await sbx.read_file("counter")).stdout

        for n in range(3):
            await run.tool_call("write", lambda n=n: write(n), input={"n": n})
        listing = await sbx.shell(LISTING)
    return {"workspace": listing.stdout}


def engine(db: str | Path, home: str | Path, log: str | Path, **options: Any) -> durable_sandbox.Engine:
    return durable_sandbox.Engine(SqliteStore(db), providers={"local": LoggingProvider(home, log)}, **options)


def child_main(db: str, run_id: str, log: str, home: str, params: str) -> None:
    async def go() -> None:
        eng = engine(db, home, log, worker_id="child", lease_ttl=0.5)
        await eng.run(agent_tools_flow, json.loads(params), run_id=run_id)

    asyncio.run(go())


if __name__ == "__main__":
    child_main(*sys.argv[1:6])
