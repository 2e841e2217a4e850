"""`dsb mcp --sandbox NAME`: an MCP server (stdio) whose tools are a Sandbox's calls (docs/agents.md)."""

from __future__ import annotations

import asyncio

import click

from durable_sandbox.cli.commands.common import pass_settings
from durable_sandbox.runs.errors import CliError
from durable_sandbox.runs.settings import Settings


@click.command("mcp")
@click.option("--sandbox", "name", required=True, metavar="NAME", help="The Sandbox resource the tools call.")
@click.option("--url", envvar="DSB_SESSION_URL", metavar="URL", required=True,
              help="The call API (the operator's --session-port); default $DSB_SESSION_URL.")
@click.option("--token", envvar="DSB_SESSION_TOKEN", default=None,
              help="A Kubernetes bearer token; default the kubeconfig's, or the in-cluster ServiceAccount's.")
@pass_settings
def mcp_cmd(settings: Settings, name: str, url: str, token: str | None) -> None:
    """Serve Sandbox NAME's calls as MCP tools on stdin/stdout (shell, write_file, read_file, list_files), for an
    MCP client to start: {"command": "dsb", "args": ["-n", "NS", "mcp", "--sandbox", "NAME"]}."""
    try:
        from durable_sandbox.client import AsyncSandboxClient
        from durable_sandbox.client.credentials import CredentialsError
        from durable_sandbox.mcp.server import serve_stdio
    except ImportError as exc:
        raise CliError(f"dsb mcp needs the mcp extra: pip install 'durable-sandbox[mcp]' ({exc})") from exc
    try:
        box = AsyncSandboxClient.attach(name, namespace=settings.namespace, url=url, token=token)
    except (CredentialsError, ValueError) as exc:
        raise CliError(str(exc)) from None
    asyncio.run(serve_stdio(box))
