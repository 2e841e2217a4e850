"""The MCP server: one tool per call of the call API, each a journaled call of the Sandbox through the client.

Each tool call gets an operation id of its own, which the client keeps across its retries: a tool call whose answer
was lost on the way from the operator runs once. The MCP client's own retry of a tool call is a new call (MCP gives
a tool call no id that outlives its request).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from durable_sandbox.call_text import outcome_text
from durable_sandbox.client import AsyncSandboxClient, CallResult, SandboxCallError

__all__ = ["sandbox_server"]


def _text(result: CallResult) -> str:
    return outcome_text(result.exit_code, result.stdout, result.stderr,
                        cut=result.stdout_bytes is not None or result.stderr_bytes is not None)


async def _answer(call: Awaitable[CallResult]) -> str:
    """The call's outcome, or a refusal (401, 403, 409 held by a Workflow, ...) as the tool's error, which the model
    reads: the API's what/where/do, never a token."""
    try:
        return _text(await call)
    except SandboxCallError as exc:
        raise ToolError(str(exc)) from None
    except httpx.TransportError as exc:
        raise ToolError(f"the call API did not answer ({type(exc).__name__}); the call was retried with the same "
                        f"operation id for as long as the client retries; try the tool again later") from None


def sandbox_server(box: AsyncSandboxClient) -> MCPServer[Any]:
    """An MCP server whose tools call Sandbox ``box`` (its name and namespace say which)."""
    where = f"Sandbox {box.target.namespace}/{box.target.name}"
    server: MCPServer[Any] = MCPServer(name="durable-sandbox", instructions=(
        f"Tools that work in {where}: a durable workspace whose files persist between calls. Every call is "
        f"journaled; its result is what the sandbox did."))

    @server.tool(description=f"Run a shell command in {where}'s workspace; returns its exit code, stdout and stderr.")
    async def shell(command: str, timeout: float | None = None, cwd: str | None = None) -> str:
        return await _answer(box.run(command, timeout=timeout, cwd=cwd))

    @server.tool(description=f"Write a text file in {where}'s workspace (directories are made).")
    async def write_file(path: str, contents: str) -> str:
        return await _answer(box.write_file(path, contents))

    @server.tool(description=f"Read a text file of {where}'s workspace.")
    async def read_file(path: str) -> str:
        return await _answer(box.call("read_file", {"path": path}))

    @server.tool(description=f"List a directory of {where}'s workspace (directories end in /).")
    async def list_files(path: str = ".") -> str:
        return await _answer(box.call("list", {"path": path}))

    return server


async def serve_stdio(box: AsyncSandboxClient) -> None:
    async with box:
        await sandbox_server(box).run_stdio_async()
