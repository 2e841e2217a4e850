"""`dsb query` and `dsb update`: a run's query and update handlers (engine/updates.py); with --kube, a Workflow's run
through the operator's call API (client/workflows.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.cli.jsonarg import parse_json
from durable_sandbox.engine.updates import UPDATE_WAIT_SECONDS, UpdateOutcome
from durable_sandbox.runs.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from durable_sandbox.runs.session import open_engine
from durable_sandbox.runs.settings import Settings

URL_HELP = "With --kube: the operator's call API (its --session-port); default $DSB_SESSION_URL."
TOKEN_HELP = "With --kube: a Kubernetes bearer token; default the kubeconfig's, or the in-cluster ServiceAccount's."


def _in_cluster(settings: Settings, workflow: str, url: str | None, token: str | None,
                ask: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """With --kube: ``ask`` Workflow ``workflow``'s run through the call API; its JSON answer."""
    from durable_sandbox.client import SandboxCallError, WorkflowClient
    from durable_sandbox.client.credentials import CredentialsError

    if not url:
        raise CliError("with --kube, queries and updates go through the operator's call API: give its address with "
                       "--url or $DSB_SESSION_URL (the operator's --session-port; docs/kubernetes.md)")
    try:
        with WorkflowClient.attach(workflow, namespace=settings.namespace, url=url, token=token) as wf:
            return ask(wf)
    except SandboxCallError as exc:
        raise CliError(str(exc), code=EXIT_USAGE if exc.status in (400, 404, 409) else EXIT_FAILED) from None
    except CredentialsError as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None


@click.command()
@click.argument("run_id", metavar="RUN")
@click.argument("name")
@click.option("--arg", "arg_json", metavar="JSON", default=None, help="The query's argument (JSON).")
@click.option("--url", envvar="DSB_SESSION_URL", metavar="URL", default=None, help=URL_HELP)
@click.option("--token", envvar="DSB_SESSION_TOKEN", default=None, help=TOKEN_HELP)
@pass_settings
def query(settings: Settings, run_id: str, name: str, arg_json: str | None, url: str | None, token: str | None) -> None:
    """Ask a run's query handler NAME (registered with ctx.query_handler) and print its answer (JSON).

    Answered from the run's journal, replayed read-only in this process (the workflow's module must import
    here): no lease is taken, nothing is written, a run executing elsewhere is not held up. With --kube, RUN is a
    Workflow's name and the operator answers (--url: its call API; the token needs get on the Workflow).
    """
    arg = parse_json(arg_json, "--arg", flag="--arg ") if arg_json is not None else None
    if settings.kube:
        doc = _in_cluster(settings, run_id, url, token, lambda wf: wf.ask("queries", name, {"arg": arg}))
        answer, run = doc["answer"], doc["runId"]
    else:
        async def go() -> Any:
            async with open_engine(settings) as engine:
                return await engine.query(run_id, name, arg)

        answer, run = run_async(go()), run_id
    if settings.output != "table":
        render.emit_data(settings, {"runId": run, "query": name, "answer": answer})
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
@click.option("--url", envvar="DSB_SESSION_URL", metavar="URL", default=None, help=URL_HELP)
@click.option("--token", envvar="DSB_SESSION_TOKEN", default=None, help=TOKEN_HELP)
@pass_settings
def update(settings: Settings, run_id: str, name: str, input_json: str | None, update_id: str | None,
           wait: float, url: str | None, token: str | None) -> None:
    """Apply a run's update handler NAME (registered with ctx.update_handler) to --input and print its result.

    The input is validated first; a refused update says why and records nothing (exit 2). An applied update
    is journaled before its result is printed, exactly once per --id: give an id to retry safely. With --kube,
    RUN is a Workflow's name and the operator applies it (--url: its call API; the token needs update on it).
    """
    data = parse_json(input_json, "--input", flag="--input ") if input_json is not None else None
    if settings.kube:
        doc = _in_cluster(settings, run_id, url, token,
                          lambda wf: wf.ask("updates", name, {"input": data, "updateId": update_id or wf.new_id()}))
        outcome = UpdateOutcome(doc["updateId"], doc["result"], bool(doc["new"]))
        run = str(doc["runId"])
    else:
        async def go() -> UpdateOutcome:
            async with open_engine(settings) as engine:
                return await engine.update(run_id, name, data, update_id=update_id, wait=wait)

        outcome, run = run_async(go()), run_id
    if settings.output != "table":
        render.emit_data(settings, {"runId": run, "update": name, **outcome.to_json()})
    else:
        click.echo(json.dumps(outcome.result, indent=2, ensure_ascii=False))
        how = "applied" if outcome.new else "already applied (its recorded result)"
        click.echo(f"update {outcome.update_id} ({name}) of run {run}: {how}", err=True)
    click.get_current_context().exit(EXIT_OK)
