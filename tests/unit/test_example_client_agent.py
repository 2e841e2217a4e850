"""examples/client_agent: the scripted agent uses a Sandbox through the Python client, fixes the bug its test shows,
and leaves the fixed workspace; its calls are named after the agent's id, so the same agent run again replays
every step from the journal and runs nothing (the e2e test kills the operator and loses the sandbox under it:
tests/e2e/test_example_client_agent.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from examples.client_agent import FIXED, run_agent

from durable_sandbox.client import SandboxClient
from tests.unit.sessions_support import serving_call_api


async def test_the_example_agent_fixes_the_bug_and_the_same_agent_again_runs_nothing(tmp_path: Path) -> None:
    async with serving_call_api(tmp_path) as (port, gate):
        def agent(agent_id: str) -> list[tuple[str, object, str]]:
            with SandboxClient.attach("box", namespace="demo", url=f"http://127.0.0.1:{port}", token="good-token") as box:
                return list(run_agent(box, agent_id).steps)

        workspace = Path(gate.handle.metadata["workspace"])
        first = await asyncio.to_thread(agent, "a1")
        assert [tool for tool, _, _ in first] == ["write_file", "write_file", "shell", "read_file", "write_file", "shell"]
        assert "AssertionError" in first[2][2] and "tests passed" in first[-1][2]
        assert (workspace / "calc.py").read_text() == FIXED
        (workspace / "calc.py").write_text("changed behind the agent's back\n")
        again = await asyncio.to_thread(agent, "a1")
        assert again == first  # every step answered from the journal
        assert (workspace / "calc.py").read_text() == "changed behind the agent's back\n"  # nothing ran again
