"""An agent that uses a durable Sandbox through MCP (docs/agents.md): a scripted loop standing in for a model.

    python -m examples.mcp_agent http://127.0.0.1:8443/v1/namespaces/demo/sandboxes/dev-box/mcp "$TOKEN"

It connects with the official MCP client over the call API's HTTP transport, lists the tools, and works the way
a coding agent does: each step is chosen from the last tool result (write a module and its test, run the test,
read the failure, fix the module, run again). No model is needed here (none is available offline), so the choice
is a rule; a real agent puts a model where :func:`next_step` is. Every tool call is a journaled call of the
Sandbox: the workspace it leaves is the Sandbox's, and survives the agent.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

__all__ = ["Transcript", "next_step", "run_agent"]

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\nassert add(2, 3) == 5, f'add(2, 3) gave {add(2, 3)}'\nprint('tests passed')\n"
MAX_STEPS = 10


@dataclass
class Transcript:
    steps: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)  # (tool, arguments, result)

    @property
    def last(self) -> str:
        return self.steps[-1][2] if self.steps else ""


def next_step(transcript: Transcript) -> tuple[str, dict[str, Any]] | None:
    """The next tool call from what happened so far (where a model would decide), or None when done."""
    done = [tool for tool, _, _ in transcript.steps]
    if not done:
        return "write_file", {"path": "calc.py", "contents": BUGGY}
    if len(done) == 1:
        return "write_file", {"path": "test_calc.py", "contents": TEST}
    if "tests passed" in transcript.last:
        return None
    if done[-1] == "shell" and "AssertionError" in transcript.last:
        return "read_file", {"path": "calc.py"}
    if done[-1] == "read_file" and "a - b" in transcript.last:
        return "write_file", {"path": "calc.py", "contents": FIXED}
    # -B: no bytecode cache; the fix has the buggy module's size and may land in the same second as its first
    # import, which Python's cache (mtime and size) would then take for the unchanged module.
    return "shell", {"command": "python3 -B test_calc.py"}


async def run_agent(url: str, token: str) -> Transcript:
    transcript = Transcript()
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http, \
            streamable_http_client(url, http_client=http) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        tools = {t.name for t in (await mcp.list_tools()).tools}
        for _ in range(MAX_STEPS):
            step = next_step(transcript)
            if step is None:
                return transcript
            tool, arguments = step
            if tool not in tools:
                raise RuntimeError(f"the MCP server has no tool {tool!r} (it has {', '.join(sorted(tools))})")
            result = await mcp.call_tool(tool, arguments)
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            transcript.steps.append((tool, arguments, text))
    raise RuntimeError(f"the agent did not finish in {MAX_STEPS} steps; last result: {transcript.last}")


if __name__ == "__main__":
    found = asyncio.run(run_agent(sys.argv[1], sys.argv[2]))
    for tool, arguments, text in found.steps:
        print(f"> {tool} {arguments}\n{text}\n")
