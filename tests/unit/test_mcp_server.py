"""`dsb mcp --sandbox NAME` (durable_sandbox/mcp/): the official MCP client starts it over stdio, lists its tools and
calls them; each tool call is a journaled call of the Sandbox through the call API (served here in process over a
local sandbox, with the fake authorizer of the service tests)."""

from __future__ import annotations

from pathlib import Path

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.dsb import DSB
from tests.unit.sessions_support import serving_call_api as call_api


def text(result: object) -> str:
    return "\n".join(c.text for c in result.content)  # type: ignore[attr-defined]


async def test_an_mcp_client_uses_the_sandbox_through_dsb_mcp(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    async with call_api(tmp_path) as (port, gate):
        params = StdioServerParameters(command=DSB, args=["-n", "demo", "mcp", "--sandbox", "box", "--url",
                                                          f"http://127.0.0.1:{port}", "--token", "good-token"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            tools = {t.name for t in (await mcp.list_tools()).tools}
            assert tools == {"shell", "write_file", "read_file", "list_files"}
            wrote = await mcp.call_tool("write_file", {"path": "src/app.py", "contents": "print('hi')\n"})
            ran = await mcp.call_tool("shell", {"command": f"echo ran >> {log}; python3 src/app.py"})
            failed = await mcp.call_tool("shell", {"command": "ls missing-dir"})
            read = await mcp.call_tool("read_file", {"path": "src/app.py"})
            listed = await mcp.call_tool("list_files", {"path": "src"})
        assert text(wrote).startswith("exit code 0")
        assert text(ran) == "exit code 0\nstdout:\nhi\n"
        assert text(failed).startswith("exit code 2") and "missing-dir" in text(failed)
        assert "print('hi')" in text(read) and "app.py" in text(listed)
        assert log.read_text() == "ran\n"
        assert (Path(gate.handle.metadata["workspace"]) / "src" / "app.py").read_text() == "print('hi')\n"


async def test_a_refused_tool_call_says_why(tmp_path: Path) -> None:
    async with call_api(tmp_path) as (port, _):
        params = StdioServerParameters(command=DSB, args=["-n", "demo", "mcp", "--sandbox", "box", "--url",
                                                          f"http://127.0.0.1:{port}", "--token", "other-token"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            result = await mcp.call_tool("shell", {"command": "true"})
    assert result.is_error and "403" in text(result) and "bob may not call this Sandbox" in text(result)
