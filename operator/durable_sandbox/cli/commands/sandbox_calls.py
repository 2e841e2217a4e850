"""`dsb sandbox exec NAME -- COMMAND...`: one call into a Sandbox through its call API (durable_sandbox.client)."""

from __future__ import annotations

import shlex
import sys

import click

from durable_sandbox.cli.commands.common import pass_settings
from durable_sandbox.runs.errors import EXIT_FAILED, CliError
from durable_sandbox.runs.settings import Settings


@click.group()
def sandbox() -> None:
    """Call a Sandbox resource directly, one journaled call at a time (docs/agents.md)."""


@sandbox.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--url", envvar="DSB_SESSION_URL", metavar="URL", required=True,
              help="The call API (the operator's --session-port); default $DSB_SESSION_URL.")
@click.option("--operation-id", metavar="ID", default=None,
              help="The call's operation id: the same id again returns the journaled result instead of running it twice.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds the command may run.")
@click.option("--cwd", metavar="DIR", default=None, help="Directory in the sandbox's workspace to run in.")
@click.option("--token", envvar="DSB_SESSION_TOKEN", default=None,
              help="A Kubernetes bearer token; default the kubeconfig's, or the in-cluster ServiceAccount's.")
@pass_settings
def exec_cmd(settings: Settings, name: str, command: tuple[str, ...], url: str, operation_id: str | None,
             timeout: float | None, cwd: str | None, token: str | None) -> None:
    """Run COMMAND in Sandbox NAME (namespace: -n, else the kubeconfig's); its output is printed and its exit code
    is dsb's. Write it after `--`: dsb sandbox exec dev-box -- ls -la"""
    from durable_sandbox.client import SandboxCallError, SandboxClient
    from durable_sandbox.client.credentials import CredentialsError

    line = command[0] if len(command) == 1 else shlex.join(command)
    try:
        with SandboxClient.attach(name, namespace=settings.namespace, url=url, token=token) as box:
            result = box.run(line, timeout=timeout, cwd=cwd, operation_id=operation_id)
    except (SandboxCallError, CredentialsError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.exit_code)
