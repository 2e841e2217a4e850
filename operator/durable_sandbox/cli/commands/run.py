"""`dsb run FILE.yaml | module:function`."""

from __future__ import annotations

import click

from durable_sandbox.cli import drive
from durable_sandbox.cli.commands.common import outcome_code, pass_settings, report_outcome, run_async, worst
from durable_sandbox.cli.errors import CliError
from durable_sandbox.cli.jsonarg import read_input
from durable_sandbox.cli.render import emit_data, state_doc
from durable_sandbox.cli.session import Settings, open_engine
from durable_sandbox.cli.targets import RunPlan, is_manifest, plan_entrypoint, plan_manifest
from durable_sandbox.engine import RunState


@click.command()
@click.argument("target")
@click.option("--input", "input_json", metavar="JSON", help="Workflow input as JSON (module:function targets).")
@click.option("--input-file", metavar="FILE", help="Read the input JSON from FILE ('-' for stdin).")
@click.option("--run-id", metavar="ID", help="Run id [default: generated; <metadata.name>-<hash> for manifests].")
@click.option("--thread-id", metavar="ID", help="Thread whose state (ctx.state) the run shares.")
@pass_settings
def run(
    settings: Settings,
    target: str,
    input_json: str | None,
    input_file: str | None,
    run_id: str | None,
    thread_id: str | None,
) -> None:
    """Run a Workflow manifest (FILE.yaml, '-' for stdin) or a workflow (module:function or registered name).

    Runs until the workflow finishes or waits. Running the same manifest again continues the same run
    (its id is derived from the manifest), so a waiting or failed run picks up where it stopped.
    """
    given, value = read_input(input_json, input_file)
    if is_manifest(target):
        if given:
            raise CliError("--input/--input-file apply to module:function targets; a manifest carries spec.input")
        plans = plan_manifest(target, run_id)
    else:
        plans = [plan_entrypoint(target, value, run_id)]
    states = run_async(_run_all(settings, plans, thread_id))
    if settings.output == "table":
        codes = [report_outcome(settings, s) for s in states]
    else:
        emit_data(settings, state_doc(states[0]) if len(states) == 1 else [state_doc(s) for s in states])
        codes = [outcome_code(settings, s) for s in states]
    click.get_current_context().exit(worst(codes))


async def _run_all(settings: Settings, plans: list[RunPlan], thread_id: str | None) -> list[RunState]:
    async with open_engine(settings) as engine:
        return [await drive.run_plan(engine, settings, plan, thread_id=thread_id) for plan in plans]
