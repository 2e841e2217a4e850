"""`dsb sandbox exec NAME -- COMMAND...` and `dsb sandbox cp SRC DST`: one call into a Sandbox through its call API
(durable_sandbox.client); `dsb sandbox rewind NAME --to-call N`: its session rewound; `shell` and `snapshot` are
in sandbox_shell.py."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from durable_sandbox.cli.commands.common import pass_settings
from durable_sandbox.runs.errors import EXIT_FAILED, CliError
from durable_sandbox.runs.settings import Settings

if TYPE_CHECKING:  # the client is imported when a command runs (dsb's start stays quick)
    from durable_sandbox.client import CallResult, Output


@click.group()
def sandbox() -> None:
    """Call a Sandbox resource directly, one journaled call at a time (docs/agents.md)."""


def call_api_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--url`` and ``--token``: where the operator's call API is and the caller's Kubernetes token (every
    ``dsb sandbox`` command that calls a Sandbox)."""
    command = click.option("--token", envvar="DSB_SESSION_TOKEN", default=None,
                           help="A Kubernetes bearer token; default the kubeconfig's, or the in-cluster "
                           "ServiceAccount's.")(command)
    return click.option("--url", envvar="DSB_SESSION_URL", metavar="URL", required=True,
                        help="The call API (the operator's --session-port); default $DSB_SESSION_URL.")(command)

@sandbox.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@call_api_options
@click.option("--operation-id", metavar="ID", default=None,
              help="The call's operation id: the same id again returns the journaled result instead of running it twice.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds the command may run.")
@click.option("--cwd", metavar="DIR", default=None, help="Directory in the sandbox's workspace to run in.")
@pass_settings
def exec_cmd(settings: Settings, name: str, command: tuple[str, ...], url: str, operation_id: str | None,
             timeout: float | None, cwd: str | None, token: str | None) -> None:
    """Run COMMAND in Sandbox NAME (namespace: -n, else the kubeconfig's); its output is printed as it comes and its
    exit code is dsb's. Write it after `--`: dsb sandbox exec dev-box -- ls -la"""
    from durable_sandbox.client import SandboxCallError, SandboxClient
    from durable_sandbox.client.credentials import CredentialsError

    line = command[0] if len(command) == 1 else shlex.join(command)
    try:
        with SandboxClient.attach(name, namespace=settings.namespace, url=url, token=token) as box:
            result = print_streamed(box.stream(line, timeout=timeout, cwd=cwd, operation_id=operation_id))
    except (SandboxCallError, CredentialsError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None
    sys.exit(result.exit_code)


@sandbox.command("rewind")
@click.argument("name")
@click.option("--to-call", "to_call", type=click.IntRange(min=0), required=True, metavar="N",
              help="Keep the session's first N calls; the calls after them are rewound.")
@call_api_options
@pass_settings
def rewind_cmd(settings: Settings, name: str, to_call: int, url: str, token: str | None) -> None:
    """Rewind Sandbox NAME's session to after its call N (docs/forks.md): the calls after N are journaled as
    rewound, never deleted; its workspace is rebuilt to the state after call N; the next call continues there.
    Needs update on the Sandbox."""
    from durable_sandbox.client import SandboxCallError, SandboxClient
    from durable_sandbox.client.credentials import CredentialsError

    try:
        with SandboxClient.attach(name, namespace=settings.namespace, url=url, token=token) as box:
            done = box.rewind(to_call)
    except (SandboxCallError, CredentialsError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None
    rewound = done.get("rewound") or []
    click.echo(f"Sandbox {name}: rewound to after call {done['toCall']}: {len(rewound)} call(s) rewound"
               + (f" ({', '.join(rewound)})" if rewound else "") + f"; sandbox {done['sandboxId']}"
               + (f", {len(done.get('replayed') or [])} call(s) replayed into it" if rewound else ""))


def print_streamed(events: Iterator[Output | CallResult]) -> CallResult:
    """Print a call's output as it comes (stdout and stderr to ours), and give its result."""
    from durable_sandbox.client import CallResult

    for event in events:
        if isinstance(event, CallResult):
            return event
        out = sys.stdout if event.stream == "stdout" else sys.stderr
        out.write(event.text)
        out.flush()
    raise CliError("the call API's event stream ended without the call's result", code=EXIT_FAILED)


_REMOTE = re.compile(r"^(?P<name>[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?):(?P<path>.+)$")


def _remote(spec: str) -> tuple[str, str] | None:
    """``NAME:PATH`` (a Sandbox's file) as (name, path); None for a local file (write ``./a:b`` for a local name with a
    colon in it)."""
    found = _REMOTE.match(spec)
    return (found["name"], found["path"]) if found else None


@sandbox.command("cp")
@click.argument("source")
@click.argument("destination")
@call_api_options
@click.option("--operation-id", metavar="ID", default=None,
              help="The call's operation id: the same id again returns the journaled result instead of running it twice.")
@pass_settings
def cp_cmd(settings: Settings, source: str, destination: str, url: str, operation_id: str | None,
           token: str | None) -> None:
    """Copy a text file into or out of a Sandbox: dsb sandbox cp notes.txt dev-box:notes.txt, or dsb sandbox cp
    dev-box:out/report.txt report.txt ('-' is stdin or stdout). One journaled call (write_file or read_file)."""
    from durable_sandbox.client import SandboxCallError, SandboxClient
    from durable_sandbox.client.credentials import CredentialsError

    into, out_of = _remote(destination), _remote(source)
    if (into is None) == (out_of is None):
        raise CliError(f"dsb sandbox cp {source} {destination}: exactly one of the two is a Sandbox's file, written "
                       f"NAME:PATH (e.g. dev-box:notes.txt); the other is a local file, or '-' for stdin/stdout")
    name, path = into or out_of  # type: ignore[misc]
    try:
        with SandboxClient.attach(name, namespace=settings.namespace, url=url, token=token) as box:
            if into is not None:
                box.write_file(path, _read_local(source), operation_id=operation_id)
                return
            text = box.read_file(path, operation_id=operation_id)
    except (SandboxCallError, CredentialsError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None
    except FileNotFoundError as exc:
        raise CliError(f"{name}:{path}: no such file in the Sandbox ({exc})", code=EXIT_FAILED) from None
    if destination == "-":
        sys.stdout.write(text)
    else:
        Path(destination).write_text(text)


def _read_local(source: str) -> str:
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {source}: {exc.strerror}") from None
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise CliError(f"{source} is not UTF-8 text: the call API's write_file carries text (send binary files "
                       f"base64-encoded and decode them in the sandbox with dsb sandbox exec)") from None
