"""`dsb runs`."""

from __future__ import annotations

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.engine import RunRecord, RunStatus
from durable_sandbox.runs.session import open_client
from durable_sandbox.runs.settings import Settings


@click.command()
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in RunStatus]),
    help="Only runs with this status (repeatable).",
)
@click.option("--workflow", metavar="W", help="Only runs of this workflow (e.g. sandbox-agent, pkg.mod:fn).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@pass_settings
def runs(settings: Settings, statuses: tuple[str, ...], workflow: str | None, limit: int) -> None:
    """List runs, newest first."""

    async def go() -> list[RunRecord]:
        async with open_client(settings) as engine:
            return await engine.runs(status=[RunStatus(s) for s in statuses] or None, workflow=workflow, limit=limit)

    render.render_runs(settings, run_async(go()))
