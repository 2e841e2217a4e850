"""`dsb cancel`, `dsb signal`, `dsb resume`."""

from __future__ import annotations

import click

from durable_sandbox.cli import drive, render
from durable_sandbox.cli.commands.common import pass_settings, report_outcome, run_async
from durable_sandbox.cli.jsonarg import parse_json
from durable_sandbox.engine import RunState
from durable_sandbox.runs.errors import EXIT_OK, CliError
from durable_sandbox.runs.session import open_client, open_engine
from durable_sandbox.runs.settings import Settings
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.sandboxes.journal import answer_problem


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--reason", default="cancelled by user", show_default=True, help="Recorded as the run's error.")
@pass_settings
def cancel(settings: Settings, run_id: str, reason: str) -> None:
    """Cancel a run: its running step stops, its sandbox is cleaned up, its status becomes cancelled.

    Exits 0 once the run is cancelled (or had already finished).
    """

    async def go() -> tuple[str, RunState]:
        async with open_client(settings) as engine:
            before = (await engine.inspect(run_id)).status
            return before, await engine.cancel(run_id, reason)

    before, state = run_async(go())
    if settings.output != "table":
        render.emit_data(settings, render.state_doc(state))
    elif before in ("succeeded", "failed", "cancelled"):
        click.echo(f"run {run_id} had already finished ({before}); nothing to cancel")
    elif state.status == "cancelled":
        click.echo(f"run {run_id} cancelled: {reason}")
    else:
        # Held by a live worker elsewhere (in a cluster: the operator, through spec.cancel).
        click.echo(f"run {run_id}: cancellation requested; the worker executing it will stop it")
    click.get_current_context().exit(EXIT_OK)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.argument("callback_id")
@click.argument("value_json", metavar="VALUE_JSON")
@click.option("--resume", "then_resume", is_flag=True, help="Resume the run right after signalling it.")
@pass_settings
def signal(settings: Settings, run_id: str, callback_id: str, value_json: str, then_resume: bool) -> None:
    """Deliver VALUE_JSON to callback CALLBACK_ID of a run (then `dsb resume RUN` continues it).

    Signalling the same value twice is a no-op; a different value for a signalled callback is an error.
    """
    value = parse_json(value_json, "VALUE_JSON", flag="")
    if (wrong := answer_problem(callback_id, value)) is not None:  # refused before it is stored: it could never change
        raise CliError(wrong)
    if then_resume and settings.kube:
        raise CliError("--resume is for local runs: in a cluster the operator continues a signalled run by itself")

    async def go() -> tuple[bool, list[str], RunState | None]:
        async with open_client(settings) as engine:
            state = await engine.inspect(run_id)
            if state.status in ("succeeded", "failed", "cancelled"):
                raise CliError(f"run {run_id} has {state.status}; it no longer takes signals")
            pending = [cb.id for cb in state.pending_callbacks]
            new = await engine.signal(run_id, callback_id, value)
            after = None
            if then_resume and isinstance(engine, Engine):
                if settings.output == "table":  # said first: the resume may not get far (its code not importable here)
                    click.echo(f"signalled {callback_id} of run {run_id}" + ("" if new else " (already had this value)"))
                after = await drive.resume_run(engine, settings, run_id)
            return new, pending, after

    new, pending, after = run_async(go())
    if pending and callback_id not in pending:
        click.echo(
            f"warning: run {run_id} is not waiting on {callback_id!r} (waiting on: {', '.join(pending)}); "
            f"the value is kept and delivered when the run reaches it",
            err=True,
        )
    ctx = click.get_current_context()
    if after is not None:
        ctx.exit(report_outcome(settings, after))
    if settings.output != "table":
        render.emit_data(settings, {"runId": run_id, "callbackId": callback_id, "value": value, "new": new})
    else:
        click.echo(f"signalled {callback_id} of run {run_id}" + ("" if new else " (already had this value)"))
        if settings.kube:
            click.echo(f"the operator continues the run; follow it with: {settings.dsb()} logs -f {run_id}")
        else:
            click.echo(f"continue with: {settings.dsb()} resume {run_id}")
    ctx.exit(EXIT_OK)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--wait", is_flag=True,
              help="If another live worker executes the run, wait for it to let go, then continue the run.")
@pass_settings
def resume(settings: Settings, run_id: str, wait: bool) -> None:
    """Drive a run again: after a signal, a due timer, a crash, or to retry a failed run.

    A run whose worker died on this machine is taken over at once. One that a live worker executes
    exits 4 saying for how long that worker holds it, unless --wait.
    """

    async def go() -> RunState:
        if settings.kube:  # refused, saying what to do instead (the operator continues runs by itself)
            async with open_client(settings) as cluster:
                return await cluster.resume(run_id)
        async with open_engine(settings) as engine:
            return await drive.resume_run(engine, settings, run_id, wait=wait)

    click.get_current_context().exit(report_outcome(settings, run_async(go())))
