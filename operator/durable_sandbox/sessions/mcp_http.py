"""MCP over HTTP served by the call API: ``/v1/namespaces/<ns>/sandboxes/<name>/mcp`` (the MCP SDK's streamable HTTP
transport, stateless, JSON answers), whose tools are the Sandbox's calls, under the same auth as every call.

Every HTTP request is authenticated and authorized before the MCP server sees it (the caller's bearer token,
TokenReview and SubjectAccessReview on ``create sandboxes/calls`` of that Sandbox: a refused one is the call API's
JSON 401/403 and reaches nothing); the tools then run as calls of the service with that token, so each is journaled
with an operation id of its own, bounded and rate-limited like any call. The request's Sandbox and token reach the
tools through a context variable set for the request (the SDK runs a stateless request's server in a task started
from it, which inherits it). DNS-rebinding protection (a Host check) is off: it guards servers that trust a
browser's ambient credentials, and this one trusts only the bearer token.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from durable_sandbox.call_text import outcome_text
from durable_sandbox.providers.contract import ProviderError
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.models import (
    CallAnswer,
    ListRequest,
    ReadFileRequest,
    ShellRequest,
    WriteFileRequest,
)
from durable_sandbox.sessions.service import SessionService

__all__ = ["McpEndpoint"]


@dataclass(frozen=True)
class _Caller:
    token: str | None
    namespace: str
    name: str


_CALLER: contextvars.ContextVar[_Caller] = contextvars.ContextVar("durable_sandbox_mcp_caller")


def _text(answer: CallAnswer) -> str:
    return outcome_text(answer.exitCode, answer.stdout, answer.stderr,
                        cut=answer.stdoutBytes is not None or answer.stderrBytes is not None)


class McpEndpoint:
    """The MCP server of the call API (one per process; the Sandbox is the request's)."""

    def __init__(self, service: SessionService) -> None:
        self.service = service
        self.server: MCPServer[Any] = MCPServer(name="durable-sandbox", instructions=(
            "Tools that work in a durable Sandbox's workspace, whose files persist between calls. Every call is "
            "journaled; its result is what the sandbox did."))
        self._tools()
        self.app = self.server.streamable_http_app(
            streamable_http_path="/mcp", stateless_http=True, json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    def lifespan(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Enter around serving: the SDK's session manager runs the requests' servers."""
        return self.server.session_manager.run()

    async def handle(self, scope: Scope, receive: Receive, send: Send, *, token: str | None, namespace: str,
                     name: str, refuse: Callable[[CallRefused], ASGIApp]) -> None:
        try:
            await self.service.auth.check(token, namespace, name)
        except CallRefused as refused:
            await refuse(refused)(scope, receive, send)
            return
        reset = _CALLER.set(_Caller(token, namespace, name))
        try:
            await self.app({**scope, "path": "/mcp", "raw_path": b"/mcp", "root_path": ""}, receive, send)
        finally:
            _CALLER.reset(reset)

    def _tools(self) -> None:
        server, call = self.server, self._call

        @server.tool(description="Run a shell command in the Sandbox's workspace; returns its exit code, stdout and stderr.")
        async def shell(command: str, timeout: float | None = None, cwd: str | None = None) -> str:
            return await call(lambda op: ShellRequest(operationId=op, command=command, timeout=timeout, cwd=cwd))

        @server.tool(description="Write a text file in the Sandbox's workspace (directories are made).")
        async def write_file(path: str, contents: str) -> str:
            return await call(lambda op: WriteFileRequest(operationId=op, path=path, contents=contents))

        @server.tool(description="Read a text file of the Sandbox's workspace.")
        async def read_file(path: str) -> str:
            return await call(lambda op: ReadFileRequest(operationId=op, path=path))

        @server.tool(description="List a directory of the Sandbox's workspace (directories end in /).")
        async def list_files(path: str = ".") -> str:
            return await call(lambda op: ListRequest(operationId=op, path=path))

    async def _call(self, make: Callable[[str], Any]) -> str:
        caller = _CALLER.get()
        request = make(f"mcp-{uuid.uuid4().hex}")  # a tool call has no id that outlives its request
        try:
            answer: Awaitable[CallAnswer] = self.service.call(caller.token, caller.namespace, caller.name, request)
            return _text(await answer)
        except CallRefused as refused:
            raise ToolError(str(refused)) from None
        except ProviderError as exc:
            raise ToolError(f"the provider failed the call: {exc}; try the tool again") from None
