"""`dsb run FILE.yaml | module:function [--detach | --dry-run]`."""

from __future__ import annotations

import click

from durable_sandbox.cli import drive, dryrun
from durable_sandbox.cli.commands import fork
from durable_sandbox.cli.commands.common import outcome_code, pass_settings, report_outcome, run_async, worst
from durable_sandbox.cli.jsonarg import read_input
from durable_sandbox.cli.render import emit_data, state_doc
from durable_sandbox.cli.targets import RunPlan, is_manifest, plan_entrypoint, plan_manifest
from durable_sandbox.engine import RunRecord, RunState
from durable_sandbox.runs.detach import spawn
from durable_sandbox.runs.errors import EXIT_OK, CliError
from durable_sandbox.runs.session import cluster_module, open_engine, open_local_store
from durable_sandbox.runs.settings import Settings


@click.command()
@click.argument("target")
@click.option("--input", "input_json", metavar="JSON", help="Workflow input as JSON (module:function targets).")
@click.option("--input-file", metavar="FILE", help="Read the input JSON from FILE ('-' for stdin).")
@click.option("--run-id", metavar="ID", help="Run id [default: generated; <metadata.name>-<hash> for manifests].")
@click.option("--thread-id", metavar="ID", help="Thread whose state (ctx.state) the run shares.")
@click.option("--detach", is_flag=True, help="Create the run(s) and return; a background process drives them "
              "(then `dsb wait RUN`, `dsb logs -f RUN`).")
@click.option("--dry-run", is_flag=True, help="Validate and print what would run; create and run nothing.")
@click.option("--fork-of", metavar="RUN", help="Start from RUN's call N (--after): its workspace and journal up to "
              "there, the rest run anew (docs/forks.md).")
@click.option("--after", "after_call", type=click.IntRange(min=0), metavar="N", help="With --fork-of: the call.")
@pass_settings
def run(
    settings: Settings,
    target: str,
    input_json: str | None,
    input_file: str | None,
    run_id: str | None,
    thread_id: str | None,
    detach: bool,
    dry_run: bool,
    fork_of: str | None,
    after_call: int | None,
) -> None:
    """Run a Workflow manifest (FILE.yaml, '-' for stdin) or a workflow (module:function or registered name).

    Runs until the workflow finishes or waits. Running the same manifest again continues the same run
    (its id is derived from the manifest), so a waiting or failed run picks up where it stopped, and a
    finished one is reported, not run again.
    """
    if detach and dry_run:
        raise CliError("give --detach or --dry-run, not both")
    if settings.kube:
        _run_in_cluster(settings, target, input_json or input_file, run_id, thread_id, detach, dry_run)
    if detach and target == "-":
        raise CliError("--detach needs a manifest file: the background process cannot read stdin again")
    given, value = read_input(input_json, input_file)
    if fork_of is not None:
        if detach or dry_run or thread_id:
            raise CliError("--fork-of runs the fork now: give no --detach, --dry-run or --thread-id with it")
        _report(settings, [fork.run_fork_of(settings, target, value, given, run_id, fork_of, after_call)])
    if is_manifest(target):
        if given:
            raise CliError("--input/--input-file apply to module:function targets; a manifest carries spec.input")
        plans = plan_manifest(target, run_id)
    else:
        plans = [plan_entrypoint(target, value, run_id)]
    ctx = click.get_current_context()
    if dry_run:
        dryrun.show(settings, plans, run_async(_existing(settings, plans)))
        ctx.exit(EXIT_OK)
    if detach:
        records = run_async(_submit_all(settings, plans, thread_id))
        # A generated run id is fixed now, so the background process continues this very run.
        only = records[0].run_id if run_id is not None or not is_manifest(target) else None
        spawn(settings, target, run_id=only, thread_id=thread_id, input_value=value, has_input=given)
        if settings.output != "table":
            emit_data(settings, [_created(r) for r in records] if len(records) > 1 else _created(records[0]))
        else:
            for plan, record in zip(plans, records, strict=True):
                click.echo(f"run {record.run_id} ({plan.label}) started in the background")
            ids = " ".join(r.run_id for r in records)
            click.echo(f"follow with `{settings.dsb()} logs -f RUN`, wait with `{settings.dsb()} wait RUN` ({ids})")
        ctx.exit(EXIT_OK)
    _report(settings, run_async(_run_all(settings, plans, thread_id)))


def _run_in_cluster(
    settings: Settings, target: str, given_input: str | None, run_id: str | None, thread_id: str | None,
    detach: bool, dry_run: bool,
) -> None:
    """`dsb --kube run FILE`: apply the manifest and follow its runs (the operator executes them)."""
    if not is_manifest(target):
        raise CliError("with --kube, dsb run takes a Workflow manifest (FILE.yaml or '-'): the operator runs it")
    unsupported = {"--input/--input-file": given_input, "--run-id": run_id, "--thread-id": thread_id,
                   "--dry-run": dry_run}  # fmt: skip
    given = [flag for flag, value in unsupported.items() if value]
    if given:
        raise CliError(f"{', '.join(given)}: not with --kube (the run id is <name>-<uid[:8]>; the manifest "
                       f"carries spec.input; `kubectl apply --dry-run=server -f FILE` checks a manifest)")
    cluster_module()  # the kubernetes extra, or a usage error that names it
    from durable_sandbox.cli import cluster

    states = run_async(cluster.run_manifest(settings, cluster.load(target), detach=detach))
    ctx = click.get_current_context()
    if detach:
        ctx.exit(EXIT_OK)
    _report(settings, states)


def _report(settings: Settings, states: list[RunState]) -> None:
    """Print the runs' outcomes (or their documents) and exit with the worst of their codes."""
    if settings.output == "table":
        codes = [report_outcome(settings, s) for s in states]
    else:
        emit_data(settings, state_doc(states[0]) if len(states) == 1 else [state_doc(s) for s in states])
        codes = [outcome_code(settings, s) for s in states]
    click.get_current_context().exit(worst(codes))


def _created(run: RunRecord) -> dict[str, str]:
    return {"runId": run.run_id, "workflow": run.workflow, "status": run.status.value}


async def _existing(settings: Settings, plans: list[RunPlan]) -> list[RunRecord | None]:
    """The runs the plans would continue, read without creating a store that does not exist."""
    if not settings.postgres and not settings.store_path.exists():
        return [None] * len(plans)
    store = await open_local_store(settings)
    try:
        return [await store.get_run(p.run_id) if p.run_id else None for p in plans]
    finally:
        await store.close()


async def _submit_all(settings: Settings, plans: list[RunPlan], thread_id: str | None) -> list[RunRecord]:
    async with open_engine(settings, create=True) as engine:
        return [await drive.submit(engine, plan, thread_id=thread_id) for plan in plans]


async def _run_all(settings: Settings, plans: list[RunPlan], thread_id: str | None) -> list[RunState]:
    async with open_engine(settings, create=True) as engine:
        return [await drive.run_plan(engine, settings, plan, thread_id=thread_id) for plan in plans]
