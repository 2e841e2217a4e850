"""`dsb query` and `dsb update`: a run's query and update handlers (engine/updates.py)."""

from __future__ import annotations

import json
from typing import Any

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.cli.jsonarg import parse_json
from durable_sandbox.engine.updates import UPDATE_WAIT_SECONDS, UpdateOutcome
from durable_sandbox.runs.errors import EXIT_OK, CliError
from durable_sandbox.runs.session import open_engine
from durable_sandbox.runs.settings import Settings

_NOT_IN_CLUSTER = (
    "dsb {command} works on the local store (SQLite or PostgreSQL, --store); in a cluster, ask the operator's "
    "call API: POST /v1/namespaces/<ns>/workflows/<name>/{path}/<name> (docs/kubernetes.md)"
)


def _local_only(settings: Settings, command: str) -> None:
    if settings.kube:
        raise CliError(_NOT_IN_CLUSTER.format(command=command, path="queries" if command == "query" else "updates"))


@click.command()
@click.argument("run_id", metavar="RUN")
@click.argument("name")
@click.option("--arg", "arg_json", metavar="JSON", default=None, help="The query's argument (JSON).")
@pass_settings
def query(settings: Settings, run_id: str, name: str, arg_json: str | None) -> None:
    """Ask a run's query handler NAME (registered with ctx.query_handler) and print its answer (JSON).

    Answered from the run's journal, replayed read-only in this process (the workflow's module must import
    here): no lease is taken, nothing is written, a run executing elsewhere is not held up.
    """
    _local_only(settings, "query")
    arg = parse_json(arg_json, "--arg", flag="--arg ") if arg_json is not None else None

    async def go() -> Any:
        async with open_engine(settings) as engine:
            return await engine.query(run_id, name, arg)

    answer = run_async(go())
    if settings.output != "table":
        render.emit_data(settings, {"runId": run_id, "query": name, "answer": answer})
    else:
        click.echo(json.dumps(answer, indent=2, ensure_ascii=False))
    click.get_current_context().exit(EXIT_OK)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.argument("name")
@click.option("--input", "input_json", metavar="JSON", default=None, help="The update's input (JSON).")
@click.option("--id", "update_id", metavar="ID", default=None,
              help="The update's id: the same id again returns the recorded result instead of applying it twice "
                   "(default: a new id, printed).")
@click.option("--wait", "wait", type=float, default=UPDATE_WAIT_SECONDS, show_default=True, metavar="SECONDS",
              help="How long to wait for a live worker executing the run to let go of it (then exit 4).")
@pass_settings
def update(settings: Settings, run_id: str, name: str, input_json: str | None, update_id: str | None,
           wait: float) -> None:
    """Apply a run's update handler NAME (registered with ctx.update_handler) to --input and print its result.

    The input is validated first; a refused update says why and records nothing (exit 2). An applied update
    is journaled before its result is printed, exactly once per --id: give an id to retry safely.
    """
    _local_only(settings, "update")
    data = parse_json(input_json, "--input", flag="--input ") if input_json is not None else None

    async def go() -> UpdateOutcome:
        async with open_engine(settings) as engine:
            return await engine.update(run_id, name, data, update_id=update_id, wait=wait)

    outcome = run_async(go())
    if settings.output != "table":
        render.emit_data(settings, {"runId": run_id, "update": name, **outcome.to_json()})
    else:
        click.echo(json.dumps(outcome.result, indent=2, ensure_ascii=False))
        how = "applied" if outcome.new else "already applied (its recorded result)"
        click.echo(f"update {outcome.update_id} ({name}) of run {run_id}: {how}", err=True)
    click.get_current_context().exit(EXIT_OK)
