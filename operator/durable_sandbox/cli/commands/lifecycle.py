"""`dsb wait`, `dsb delete` and `dsb prune`: waiting for a run started elsewhere, and removing finished runs
(a deleted run's env values go too: the engine session forgets the values of runs that no longer exist)."""

from __future__ import annotations

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, report_outcome, run_async
from durable_sandbox.cli.duration import parse_duration
from durable_sandbox.engine import RunState
from durable_sandbox.runs.errors import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, CliError
from durable_sandbox.runs.session import open_engine
from durable_sandbox.runs.settings import Settings


@click.command("wait")
@click.argument("run_id", metavar="RUN")
@click.option("--timeout", metavar="DURATION", help="Give up after DURATION (e.g. 90s, 10m, 1h): exit 5.")
@pass_settings
def wait(settings: Settings, run_id: str, timeout: str | None) -> None:
    """Wait until a run finishes or waits (on a callback or a timer), then report it as `dsb run` does and
    exit with its code: 0 succeeded, 1 failed or cancelled, 3 waiting.

    For runs started with `dsb run --detach` or executed by `dsb worker`. A run whose process died (running,
    lease expired) is reported as it is, with exit 3 and how to continue it.
    """
    seconds = parse_duration(timeout, "--timeout") if timeout is not None else None

    async def go() -> RunState:
        async with open_engine(settings) as engine:
            try:
                return await engine.wait(run_id, timeout=seconds)
            except TimeoutError:
                state = await engine.inspect(run_id)
                raise CliError(
                    f"run {run_id} is still {state.status} after {timeout}; it goes on: wait again, or follow it "
                    f"with `{settings.dsb()} logs -f {run_id}`",
                    EXIT_TIMEOUT,
                ) from None

    click.get_current_context().exit(report_outcome(settings, run_async(go())))


@click.command("delete")
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Also delete pending, running or waiting runs: cancel them first.")
@pass_settings
def delete(settings: Settings, run_ids: tuple[str, ...], force: bool) -> None:
    """Delete runs with their journal, events and signals.

    A finished run is deleted after any sandbox its journal still holds is finalized (a failed cleanup keeps
    the run, so nothing leaks). A pending, running or waiting run is refused unless --force, which cancels it
    (cleaning up its sandboxes) and then deletes it.
    """

    async def go() -> None:
        async with open_engine(settings) as engine:
            for run_id in run_ids:
                await engine.delete(run_id, force=force)
                if settings.output == "table":
                    click.echo(f"run {run_id} deleted")

    run_async(go())
    if settings.output != "table":
        render.emit_data(settings, {"deleted": list(run_ids)})
    click.get_current_context().exit(EXIT_OK)


@click.command("prune")
@click.option("--older-than", "older_than", metavar="DURATION", required=True,
              help="Delete finished runs last updated longer ago than DURATION (e.g. 7d, 12h, 30m).")
@pass_settings
def prune(settings: Settings, older_than: str) -> None:
    """Delete finished runs (succeeded, failed, cancelled) last updated more than DURATION ago, as
    `dsb delete` does. Runs whose sandbox cleanup fails are kept and listed (exit 1)."""
    seconds = parse_duration(older_than, "--older-than")

    async def go() -> tuple[list[str], dict[str, str]]:
        async with open_engine(settings) as engine:
            return await engine.prune(seconds)

    deleted, kept = run_async(go())
    if settings.output != "table":
        render.emit_data(settings, {"deleted": deleted, "kept": kept})
    else:
        click.echo(f"deleted {len(deleted)} run(s) finished more than {older_than} ago" +
                   (": " + ", ".join(deleted) if deleted else ""))
    for run_id, why in kept.items():
        click.echo(f"warning: kept run {run_id}: {why}", err=True)
    click.get_current_context().exit(EXIT_FAILED if kept else EXIT_OK)
