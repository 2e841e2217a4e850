"""examples/mcp_agent: the scripted agent uses a Sandbox through MCP over the call API's HTTP transport, fixes the
bug its test shows, and leaves the fixed workspace in the Sandbox; every tool call is a journaled call."""

from __future__ import annotations

from pathlib import Path

from examples.mcp_agent import FIXED, run_agent

from durable_sandbox.sessions.journal import SESSION, calls_run_id
from tests.unit.sessions_support import serving_mcp


async def test_the_example_agent_fixes_the_bug_through_mcp(tmp_path: Path) -> None:
    async with serving_mcp(tmp_path) as (url, gate, store):
        transcript = await run_agent(url, "good-token")
        tools = [tool for tool, _, _ in transcript.steps]
        assert tools == ["write_file", "write_file", "shell", "read_file", "write_file", "shell"]
        assert "AssertionError" in transcript.steps[2][2] and "tests passed" in transcript.last
        assert (Path(gate.handle.metadata["workspace"]) / "calc.py").read_text() == FIXED
        rows = await store.load_journal(calls_run_id("uid-1"))
        assert len([r for r in rows if r.op_id.startswith(f"{SESSION}/mcp-") and r.status == "completed"]) == 6
