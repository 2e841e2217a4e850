"""``python -m tests.fakes.e2b_server`` serves a usable fake for manual tries."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx

from durable_sandbox.providers.contract import SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import E2BProvider

REPO = Path(__file__).resolve().parents[2]


async def test_module_entry_point_serves_the_fake() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.e2b_server", "--port", "0", "--sandbox-port", "0", "--api-key", "manual-key",
        cwd=REPO, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        lines = [(await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip() for _ in range(3)]
        config = dict(line.split("=", 1) for line in lines)
        assert config["E2B_API_KEY"] == "manual-key"
        assert config["E2B_API_URL"].startswith("http://127.0.0.1:")
        provider = E2BProvider(environ=config)
        handle = await provider.provision(SandboxSpec(), lease_seconds=60)
        result = await provider.execute(handle, ToolCall(operation_id="o", type="shell", args={"command": "echo manual"}))
        assert result.outcome == (0, "manual\n", "")
        await provider.destroy(handle)
        await provider.aclose()
        async with httpx.AsyncClient() as client:
            assert (await client.get(config["E2B_API_URL"] + "/sandboxes")).status_code == 401
    finally:
        process.terminate()
        await process.wait()
    assert process.returncode == 0, "SIGTERM stops the fake cleanly (its temp workspaces are removed)"
