"""`dsb logs RUN [-f] [--call-output]`."""

from __future__ import annotations

import json

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.cli.progress import make_display
from durable_sandbox.runs.session import open_client
from durable_sandbox.runs.settings import Settings


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("-f", "--follow", is_flag=True, help="Keep following until the run finishes or waits.")
@click.option("--call-output", is_flag=True, help="Also print each call's stdout and stderr, under its line.")
@pass_settings
def logs(settings: Settings, run_id: str, follow: bool, call_output: bool) -> None:
    """Print a run's events (operations, progress, sandbox lifecycle); -o json prints one JSON object per line
    (a completed call's object carries its stdout and stderr)."""
    run_async(_logs(settings, run_id, follow, call_output))


async def _logs(settings: Settings, run_id: str, follow: bool, call_output: bool) -> None:
    async with open_client(settings) as engine:
        if settings.output != "table":
            async for ev in engine.stream(run_id, follow=follow):
                if settings.output == "json":
                    click.echo(json.dumps(render.event_doc(ev), ensure_ascii=False, default=str))
                else:
                    render.emit_data(settings, [render.event_doc(ev)])
            return
        tty = render.is_tty()
        display = make_display(
            run_id,
            tty=tty and follow,
            console=render.console() if tty else None,
            everything=True,
            wide=settings.wide,
            call_output=call_output,
        )
        try:
            async for ev in engine.stream(run_id, follow=follow):
                display.event(ev)
        finally:
            display.close()
