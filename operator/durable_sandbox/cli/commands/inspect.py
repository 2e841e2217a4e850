"""`dsb inspect RUN` and `dsb history RUN`."""

from __future__ import annotations

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.engine import OperationRecord, RunState
from durable_sandbox.runs.session import open_client
from durable_sandbox.runs.settings import Settings


@click.command("inspect")
@click.argument("run_id", metavar="RUN")
@pass_settings
def inspect_cmd(settings: Settings, run_id: str) -> None:
    """Show a run: status, result, pending callbacks and its operations."""

    async def go() -> RunState:
        async with open_client(settings) as engine:
            return await engine.inspect(run_id)

    render.render_state(settings, run_async(go()))


@click.command()
@click.argument("run_id", metavar="RUN")
@pass_settings
def history(settings: Settings, run_id: str) -> None:
    """Show a run's journal: every record (started, completed, failed, each attempt) in order."""

    async def go() -> list[OperationRecord]:
        async with open_client(settings) as engine:
            return await engine.history(run_id)

    render.render_history(settings, run_id, run_async(go()))
