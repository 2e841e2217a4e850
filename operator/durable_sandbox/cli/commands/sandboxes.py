"""`dsb --kube sandboxes`."""

from __future__ import annotations

import time
from typing import Any

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.runs.errors import CliError
from durable_sandbox.runs.session import cluster_module
from durable_sandbox.runs.settings import Settings


@click.command()
@pass_settings
def sandboxes(settings: Settings) -> None:
    """List the namespace's Sandbox resources (with --kube): phase, provider, Ready, the Workflow holding it, age."""
    if not settings.kube:
        raise CliError("Sandbox resources live in a cluster: `dsb --kube sandboxes` lists them (-n NS for a namespace)")

    async def go() -> list[dict[str, Any]]:
        async with cluster_module().ClusterEngine.open(settings) as cluster:
            rows: list[dict[str, Any]] = await cluster.sandboxes()
            return rows

    render.render_sandboxes(settings, run_async(go()), now=time.time())
