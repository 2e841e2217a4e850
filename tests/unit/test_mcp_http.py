"""MCP over HTTP from the call API (sessions/mcp_http.py): the official MCP client (streamable HTTP) lists the
Sandbox's tools and calls them, each a journaled call of the session service with the caller's token; a caller
without a token or the permission is refused by the call API (401/403 JSON) before MCP sees the request, and
nothing runs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from durable_sandbox.sessions.journal import SESSION, calls_run_id
from tests.unit.sessions_support import effects, serving_mcp


def text(result: object) -> str:
    return "\n".join(c.text for c in result.content)  # type: ignore[attr-defined]


async def test_the_official_mcp_client_calls_the_sandbox_over_http(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    async with serving_mcp(tmp_path) as (url, _gate, store):
        http = create_mcp_http_client(headers={"Authorization": "Bearer good-token"})
        async with http, streamable_http_client(url, http_client=http) as (read, write), \
                ClientSession(read, write) as mcp:
            await mcp.initialize()
            assert {t.name for t in (await mcp.list_tools()).tools} == {"shell", "write_file", "read_file", "list_files"}
            wrote = await mcp.call_tool("write_file", {"path": "src/app.py", "contents": "print('hi')\n"})
            ran = await mcp.call_tool("shell", {"command": f"echo ran >> {log}; python3 src/app.py"})
            read = await mcp.call_tool("read_file", {"path": "src/app.py"})
            listed = await mcp.call_tool("list_files", {"path": "src"})
        assert text(wrote).startswith("exit code 0")
        assert text(ran) == "exit code 0\nstdout:\nhi\n"
        assert "print('hi')" in text(read) and "app.py" in text(listed)
        assert effects(log) == ["ran"]
        rows = await store.load_journal(calls_run_id("uid-1"))
        journaled = [r for r in rows if r.op_id.startswith(f"{SESSION}/mcp-") and r.status == "completed"]
        assert len(journaled) == 4  # every tool call a journaled call with an operation id of its own


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("forged", 401), ("other-token", 403)])
async def test_a_refused_caller_reaches_nothing(tmp_path: Path, token: str | None, status: int) -> None:
    log = tmp_path / "effects.log"
    async with serving_mcp(tmp_path) as (url, gate, store):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "shell", "arguments": {"command": f"echo ran >> {log}"}}}
        async with httpx.AsyncClient() as http:
            answer = await http.post(url, json=body, headers={**headers, "Accept": "application/json, text/event-stream"})
        assert answer.status_code == status
        error = answer.json()["error"]
        assert error["what"] and error["do"]
        assert "forged" not in answer.text and "other-token" not in answer.text
        assert effects(log) == [] and gate.taken == 0
        assert await store.get_run(calls_run_id("uid-1")) is None
