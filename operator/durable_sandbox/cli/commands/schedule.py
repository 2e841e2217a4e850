"""`dsb schedule add|list|remove|run-due`: runs of the local store made on a schedule (cli/schedule_book.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click
from rich.table import Table

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.cli.drive import submit
from durable_sandbox.cli.jsonarg import read_input
from durable_sandbox.cli.render import emit_data
from durable_sandbox.cli.schedule_book import LocalSchedule, ScheduleBook, Ticked, run_due
from durable_sandbox.cli.targets import is_manifest, plan_entrypoint, plan_manifest
from durable_sandbox.engine import Engine
from durable_sandbox.kube.spec import plan
from durable_sandbox.kube.spec.manifests import load_manifests
from durable_sandbox.runs.errors import EXIT_OK, CliError
from durable_sandbox.runs.session import open_engine
from durable_sandbox.runs.settings import Settings
from durable_sandbox.schedules import Concurrency

__all__ = ["book_of", "schedule"]


def book_of(settings: Settings) -> ScheduleBook:
    """The local store's schedules (``<store>.schedules.json``); with --kube a usage error saying what to do."""
    if settings.kube:
        raise CliError("dsb schedule works on the local store; in a cluster, apply a WorkflowSchedule "
                       "(docs/kubernetes.md, 'WorkflowSchedule resources') and see it with `kubectl get dwfsched`")
    return ScheduleBook(Path(f"{settings.store_path}.schedules.json"))


def _now(at: str | None) -> dt.datetime:
    if at is None:
        return dt.datetime.now(dt.UTC)
    try:
        when = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"--at {at!r} is not a time: write e.g. 2026-05-01T10:00:00Z") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


async def submit_tick(engine: Engine, entry: LocalSchedule, run_id: str) -> None:
    """Create the tick's run (pending; idempotent for its run id): the schedule's target planned as `dsb run`
    plans it, under the tick's run id."""
    if is_manifest(entry.target):
        plans = plan.plan_resources(load_manifests(Path(entry.target)), source=entry.target, run_id=run_id)
    else:
        plans = [plan.plan_entrypoint(entry.target, entry.input, run_id)]
    await submit(engine, plans[0], thread_id=None)


@click.group()
def schedule() -> None:
    """Runs of the local store made on a schedule: cron (with a time zone) or every N.

    `dsb schedule run-due` (or `dsb worker --schedules`, every poll) creates the runs that are due; a worker
    executes them. A tick's run id is <schedule>-<Unix time of the tick>, so no tick is made twice.
    """


@schedule.command("add")
@click.argument("name")
@click.argument("target")
@click.option("--every", metavar="DURATION", help="A period: 30s, 5m, 1h30m, 2d.")
@click.option("--cron", metavar="EXPR", help="A 5-field cron expression, e.g. '*/5 * * * *'.")
@click.option("--time-zone", metavar="TZ", help="The IANA time zone --cron is read in [default: UTC].")
@click.option("--concurrency-policy", type=click.Choice([c.value for c in Concurrency]), default="Allow",
              show_default=True, help="A due tick while the schedule's runs still run: run beside them, wait, or "
              "cancel them.")
@click.option("--starting-deadline", type=click.IntRange(min=0), metavar="SECONDS",
              help="A tick not started within this many seconds of its time is missed, not run.")
@click.option("--input", "input_json", metavar="JSON", help="The input (module:function targets).")
@click.option("--input-file", metavar="FILE", help="Read the input JSON from FILE.")
@pass_settings
def add(settings: Settings, name: str, target: str, every: str | None, cron: str | None, time_zone: str | None,
        concurrency_policy: str, starting_deadline: int | None, input_json: str | None, input_file: str | None) -> None:
    """Add schedule NAME running TARGET (what `dsb run` takes: a manifest of one Workflow, or module:function)."""
    book = book_of(settings)
    given, value = read_input(input_json, input_file)
    if is_manifest(target):
        if given:
            raise CliError("--input/--input-file apply to module:function targets; a manifest carries spec.input")
        if len(plan_manifest(target, None)) != 1:
            raise CliError(f"{target}: a schedule runs one Workflow; this manifest has several")
        target = str(Path(target).resolve())
    else:
        plan_entrypoint(target, value, None)
    try:
        entry = LocalSchedule(name=name, cron=cron, time_zone=time_zone, every=every,
                              concurrency=Concurrency(concurrency_policy), starting_deadline_seconds=starting_deadline,
                              target=target, input=value, created=_now(None).strftime("%Y-%m-%dT%H:%M:%SZ"))
        first = entry.timing().next_after(_now(None))
    except ValueError as exc:
        raise CliError(f"schedule {name}: {str(exc).splitlines()[-1] if 'validation error' in str(exc) else exc}") from None
    with book.locked() as entries:
        if name in entries:
            raise CliError(f"schedule {name} exists already (`{settings.dsb()} schedule remove {name}` first)")
        entries[name] = entry
    click.echo(f"schedule {name} added ({entry.describe()}); first tick at {first.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    click.get_current_context().exit(EXIT_OK)


@schedule.command("list")
@pass_settings
def list_cmd(settings: Settings) -> None:
    """The schedules, when each last ticked and how many ticks it missed."""
    entries = book_of(settings).entries()
    now = _now(None)
    rows = [{"name": e.name, "when": e.describe(), "target": e.target, "concurrencyPolicy": e.concurrency.value,
             "lastScheduleTime": e.last_schedule_time, "next": e.timing().next_after(now).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "missedTicks": e.missed_ticks, "runs": e.made} for e in entries]
    if settings.output != "table":
        emit_data(settings, rows)
        return
    if not entries:
        click.echo("no schedules")
        return
    table = Table(title_justify="left")
    for col in ("Schedule", "When", "Last", "Next", "Missed"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(e.name, e.describe(), e.last_schedule_time or "-",
                      e.timing().next_after(now).strftime("%Y-%m-%dT%H:%M:%SZ"), str(e.missed_ticks))
    render.console(wide=settings.wide).print(table)


@schedule.command("remove")
@click.argument("name")
@pass_settings
def remove(settings: Settings, name: str) -> None:
    """Remove schedule NAME (the runs it made stay)."""
    with book_of(settings).locked() as book:
        if book.pop(name, None) is None:
            raise CliError(f"no schedule {name} (`{settings.dsb()} schedule list` lists them)")
    click.echo(f"schedule {name} removed")


def report(settings: Settings, ticked: list[Ticked]) -> None:
    for t in ticked:
        if t.created:
            click.echo(f"{t.schedule}: created run {t.created}")
        if t.recorded:
            click.echo(f"{t.schedule}: run {t.recorded} was made already; recorded")
        if t.missed:
            click.echo(f"warning: {t.schedule}: {len(t.missed)} tick(s) not run ({', '.join(t.missed[-5:])}): only "
                       "the newest due tick runs, within --starting-deadline", err=True)
        if t.waiting:
            click.echo(f"{t.schedule}: the due tick waits: {t.waiting}")
        for run_id in t.cancelled:
            click.echo(f"{t.schedule}: cancelled run {run_id} (concurrency policy Replace)")


@schedule.command("run-due")
@click.option("--at", metavar="TIME", help="Take the time to be TIME (RFC 3339), to try a schedule out.")
@pass_settings
def run_due_cmd(settings: Settings, at: str | None) -> None:
    """Create the runs that are due now (pending: `dsb worker` executes them)."""
    book = book_of(settings)

    async def go() -> list[Ticked]:
        async with open_engine(settings, create=True) as engine:
            return await run_due(engine, book, _now(at), submit_tick)

    ticked = run_async(go())
    if settings.output != "table":
        emit_data(settings, [t.model_dump() for t in ticked])
    else:
        report(settings, ticked)
    click.get_current_context().exit(EXIT_OK)
