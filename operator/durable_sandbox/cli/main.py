"""`dsb`: run Workflow manifests and Python workflows locally, and inspect, signal, resume and cancel runs.

Exit codes: 0 succeeded, 1 failed or cancelled, 2 usage or invalid input (bad manifest, malformed JSON,
unknown run or workflow, a --store file that does not exist), 3 waiting on a callback or a timer, 4 another
live worker executes the run, 5 `dsb wait --timeout` gave up, 130/143 interrupted by SIGINT/SIGTERM (the run
stays resumable).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Sequence
from typing import Any, Final

import click

from durable_sandbox.cli.api_errors import api_refusal
from durable_sandbox.cli.targets import add_cwd_to_path
from durable_sandbox.engine import (
    LeaseHeld,
    NotRunnableHere,
    RunConflict,
    RunNotFinished,
    RunNotFound,
    SerializationError,
    SignalConflict,
    StoreError,
    WorkflowNotFound,
)
from durable_sandbox.engine.errors import QueryRefused, StoreUnavailable, UpdateConflict, UpdateRefused
from durable_sandbox.kube.spec.manifests import ManifestError
from durable_sandbox.runs.errors import EXIT_FAILED, EXIT_LEASE_HELD, EXIT_USAGE, CliError, Interrupted
from durable_sandbox.runs.settings import Settings

OUTPUTS: Final[Sequence[str]] = ["table", "wide", "json", "yaml"]

# Errors that mean "what you asked for is wrong", as opposed to "the run went wrong".
_USAGE_ERRORS = (ManifestError, RunNotFound, RunNotFinished, WorkflowNotFound, RunConflict, SignalConflict, SerializationError,
                 UpdateRefused, UpdateConflict, QueryRefused)


def _fail(ctx: click.Context, message: str, code: int) -> None:
    for line in message.splitlines() or [message]:
        click.echo(f"error: {line}", err=True)
    ctx.exit(code)


class DsbGroup(click.Group):
    """Turns known errors into one `error: ...` line and an exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except CliError as exc:
            _fail(ctx, str(exc), exc.code)
        except NotRunnableHere as exc:
            # Code this process cannot import is no failure of the run: it stays as it was, to continue from
            # where its module imports.
            settings = ctx.find_object(Settings)
            dsb = settings.dsb() if settings is not None else "dsb"
            _fail(ctx, f"{exc} Then continue it with `{dsb} resume {shlex.quote(exc.run_id)}`.", EXIT_USAGE)
        except _USAGE_ERRORS as exc:
            _fail(ctx, str(exc), EXIT_USAGE)
        except LeaseHeld as exc:
            _fail(ctx, str(exc), EXIT_LEASE_HELD)
        except StoreError as exc:
            _fail(ctx, str(exc), EXIT_FAILED)
        except StoreUnavailable as exc:
            # The store stayed away longer than it waits (a PostgreSQL server down): nothing is lost.
            settings = ctx.find_object(Settings)
            dsb = settings.dsb() if settings is not None else "dsb"
            then = f"; continue it with `{dsb} resume {shlex.quote(exc.run_id)}` once it is back" if exc.run_id else ""
            _fail(ctx, f"{exc}{then}", EXIT_FAILED)
        except BrokenPipeError:
            # `dsb logs RUN | head`: the reader went away; stop quietly like other Unix tools.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(EXIT_FAILED)
        except Interrupted as exc:
            name = signal.Signals(exc.signum).name
            if exc.run_id is None:
                _fail(ctx, f"interrupted ({name})", exc.code)
            settings = ctx.find_object(Settings)
            dsb = settings.dsb() if settings is not None else "dsb"
            _fail(ctx, f"interrupted ({name}); run {exc.run_id} stopped and stays resumable (its sandbox is "
                       f"hibernated): continue it with `{dsb} resume {shlex.quote(str(exc.run_id))}`", exc.code)
        except KeyboardInterrupt:
            _fail(ctx, "interrupted", 130)
        except Exception as exc:
            if os.environ.get("DSB_DEBUG"):
                raise
            settings = ctx.find_object(Settings)
            if (refusal := api_refusal(exc, settings.namespace if settings is not None else None)) is not None:
                _fail(ctx, *refusal)  # dsb --kube: one line, not the client's dump
            _fail(ctx, f"{type(exc).__name__}: {exc} (set DSB_DEBUG=1 for a traceback)", EXIT_FAILED)
        return None


@click.group(cls=DsbGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--store",
    metavar="PATH|URL",
    default=None,
    help="The store: a SQLite file, or postgresql://user@host/db (password from ~/.pgpass or $PGPASSWORD) "
    "[default: $DSB_STORE, else $DURABLE_SANDBOX_HOME/runs.db].",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(OUTPUTS),
    default="table",
    show_default=True,
    help="Output format (wide: tables with full ids).",
)
@click.option(
    "--kube",
    is_flag=True,
    help="Work on the Workflows of a Kubernetes cluster (the operator executes them), not the local store; "
    "the cluster from $KUBECONFIG.",
)
@click.option("-n", "--namespace", metavar="NS", help="With --kube: the namespace [default: the kubeconfig's].")
@click.version_option(package_name="durable-sandbox", prog_name="dsb")
@click.pass_context
def cli(ctx: click.Context, store: str | None, output: str, kube: bool, namespace: str | None) -> None:
    """Durable sandbox workflows on your machine (or, with --kube, in a cluster): run, inspect, signal, resume, cancel."""
    # module:function references resolve from the current directory, as with `python -m`;
    # resume/cancel need this too, to re-import a run's workflow.
    add_cwd_to_path()
    ctx.obj = Settings(store=store, store_given=store is not None, kube=kube, namespace=namespace)
    ctx.obj.set_output(output)


def _set_output(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.find_object(Settings).set_output(value)  # type: ignore[union-attr]


def _set_store(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        settings = ctx.find_object(Settings)
        assert settings is not None
        settings.store, settings.store_given = value, True


def _set_kube(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_object(Settings).kube = True  # type: ignore[union-attr]


def _set_namespace(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.find_object(Settings).namespace = value  # type: ignore[union-attr]


def _accept_global_options(command: click.Command) -> None:
    """`dsb runs -o json` works like `dsb -o json runs`, as kubectl users expect."""
    command.params.append(
        click.Option(["-o", "--output"], type=click.Choice(OUTPUTS), default=None,
                     expose_value=False, callback=_set_output, help="Output format (same as before the command).")
    )
    command.params.append(
        click.Option(["--store"], metavar="PATH|URL", default=None, expose_value=False, callback=_set_store,
                     help="The store (same as before the command).")
    )
    taken = {name for param in command.params for name in getattr(param, "opts", [])}
    if "--kube" not in taken:
        command.params.append(
            click.Option(["--kube"], is_flag=True, default=False, expose_value=False, callback=_set_kube,
                         help="The cluster's Workflows (same as before the command).")
        )
    if "--namespace" not in taken:  # a command with its own --namespace (dsb operator) keeps it
        command.params.append(
            click.Option(["-n", "--namespace"], metavar="NS", default=None, expose_value=False,
                         callback=_set_namespace, help="With --kube: the namespace (same as before the command).")
        )


def _register() -> None:
    from durable_sandbox.cli.commands import (
        control,
        fork,
        inspect,
        lifecycle,
        logs,
        mcp,
        operator,
        queries,
        run,
        runs,
        sandbox_calls,
        sandbox_shell,  # noqa: F401 - adds `shell` and `snapshot` to the sandbox group
        sandboxes,
        schedule,
        store_grants,
        ui,
        worker,
    )

    for command in (
        run.run,
        inspect.inspect_cmd,
        inspect.history,
        control.cancel,
        control.signal,
        control.resume,
        queries.query,
        queries.update,
        fork.fork,
        runs.runs,
        sandboxes.sandboxes,
        logs.logs,
        lifecycle.wait,
        lifecycle.delete,
        lifecycle.prune,
        worker.worker,
        ui.ui,
        mcp.mcp_cmd,
    ):
        _accept_global_options(command)
        cli.add_command(command)
    cli.add_command(operator.operator)
    for sub in store_grants.store.commands.values():
        _accept_global_options(sub)
    cli.add_command(store_grants.store)
    for sub in sandbox_calls.sandbox.commands.values():
        _accept_global_options(sub)
    cli.add_command(sandbox_calls.sandbox)
    for sub in schedule.schedule.commands.values():
        _accept_global_options(sub)
    cli.add_command(schedule.schedule)


_register()


def main() -> None:
    cli(prog_name="dsb")


if __name__ == "__main__":
    main()
