"""A strands agent workflow whose tools and model log their side effects to files, so that tests in
this process and in killed child processes can count what really ran."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from strands import Agent, tool

import durable_sandbox
from durable_sandbox.workflows.agents.scripted import ScriptedModel
from durable_sandbox.workflows.agents.strands import DurableStrandsAgent

SCRIPT: list[Any] = [
    {"text": "I will write two files.", "tool_calls": [
        {"name": "write_file", "input": {"path": "a.txt", "text": "alpha"}},
        {"name": "write_file", "input": {"path": "b.txt", "text": "beta"}},
    ]},
    {"text": "Now the tests.", "tool_calls": [{"name": "run_tests", "input": {"target": "all"}}]},
    "Done: two files written, tests pass.",
]


def log(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def read_log(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def make_agent(logfile: str) -> Agent:
    @tool
    def write_file(path: str, text: str) -> str:
        """Write text to a file in the workspace."""
        log(logfile, {"effect": "write_file", "path": path})
        return f"wrote {path}"

    @tool
    def run_tests(target: str) -> dict[str, Any]:
        """Run the test suite."""
        log(logfile, {"effect": "run_tests", "target": target})
        return {"status": "success", "content": [{"json": {"passed": 12, "failed": 0}}]}

    model = ScriptedModel(SCRIPT, on_call=lambda turn: log(logfile, {"effect": "model", "turn": turn}))
    return Agent(model=model, tools=[write_file, run_tests], callback_handler=None)


@durable_sandbox.workflow(name="tests.agent-coder")
async def coder_flow(ctx: durable_sandbox.Context, params: dict[str, Any]) -> dict[str, Any]:
    agent = make_agent(params["log"])
    result = await DurableStrandsAgent(agent).invoke(ctx, "coder", "Write a and b, then run the tests.")
    verdict = await ctx.step("summarize", lambda: {"final": str(result).strip(), "turns": len(agent.messages)})
    return verdict


def child_main(db: str, run_id: str, logfile: str) -> None:
    """Run the workflow in this process (a test sets DURABLE_SANDBOX_FAULT so that it is killed)."""
    from durable_sandbox.stores import SqliteStore

    async def go() -> None:
        engine = durable_sandbox.engine.Engine(SqliteStore(db), worker_id="child", lease_ttl=0.5)
        await engine.run(coder_flow, {"log": logfile}, run_id=run_id)

    asyncio.run(go())


if __name__ == "__main__":
    child_main(*sys.argv[1:4])
