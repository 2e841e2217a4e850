"""`dsb sandbox shell NAME`: a loop where each line read is one journaled shell call (its output printed as it
comes), until end of input; and `dsb sandbox snapshot NAME`: a journaled snapshot now."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import click

from durable_sandbox.cli.commands.common import pass_settings
from durable_sandbox.cli.commands.sandbox_calls import call_api_options, print_streamed, sandbox
from durable_sandbox.runs.errors import EXIT_FAILED, CliError
from durable_sandbox.runs.settings import Settings

_FATAL = (401, 403, 404)  # no line after this one can do better: the loop ends


@sandbox.command("shell")
@click.argument("name")
@call_api_options
@click.option("--session-id", metavar="ID", default=None,
              help="Name the calls ID-1, ID-2, ...: the same input fed again with the same id gives the journaled "
                   "results instead of running them twice (default: a new id).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds each line's command may run.")
@click.option("--cwd", metavar="DIR", default=None, help="Directory in the sandbox's workspace every line runs in.")
@pass_settings
def shell_cmd(settings: Settings, name: str, url: str, session_id: str | None, timeout: float | None, cwd: str | None,
              token: str | None) -> None:
    """Read lines from stdin and run each in Sandbox NAME as one journaled shell call, printing its output as it
    comes; ends at end of input (Ctrl-D). Each line is a shell of its own: `cd` does not carry to the next line."""
    from durable_sandbox.client import SandboxCallError, SandboxClient
    from durable_sandbox.client.credentials import CredentialsError

    prefix = session_id or f"sh-{uuid.uuid4().hex[:12]}"
    interactive = sys.stdin.isatty()
    failed = 0
    try:
        with SandboxClient.attach(name, namespace=settings.namespace, url=url, token=token) as box:
            for number, line in enumerate(_lines(interactive, name), start=1):
                try:
                    result = print_streamed(box.stream(line, timeout=timeout, cwd=cwd,
                                                       operation_id=f"{prefix}-{number}"))
                except SandboxCallError as exc:
                    if exc.status in _FATAL:
                        raise
                    click.echo(f"dsb: line {number} was not run: {exc}", err=True)
                    failed += 1
                    continue
                if result.exit_code != 0 and interactive:
                    click.echo(f"[exit {result.exit_code}]", err=True)
    except (SandboxCallError, CredentialsError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None
    if failed:
        sys.exit(EXIT_FAILED)


def _lines(interactive: bool, name: str) -> Iterator[str]:
    """The lines to run, read one at a time (a line is run before the next is read)."""
    return _Prompted(name) if interactive else (line.rstrip("\n") for line in sys.stdin if line.strip())


class _Prompted:
    """The lines typed at a prompt (``NAME$ `` on stderr), until end of input."""

    def __init__(self, name: str) -> None:
        self.prompt = f"{name}$ "

    def __iter__(self) -> _Prompted:
        return self

    def __next__(self) -> str:
        while True:
            sys.stderr.write(self.prompt)
            sys.stderr.flush()
            line = sys.stdin.readline()
            if not line:
                sys.stderr.write("\n")
                raise StopIteration
            if line.strip():
                return line.rstrip("\n")


@sandbox.command("snapshot")
@click.argument("name")
@call_api_options
@click.option("--operation-id", metavar="ID", default=None,
              help="The request's id: the same id again names the snapshot it took instead of taking another.")
@pass_settings
def snapshot_cmd(settings: Settings, name: str, url: str, operation_id: str | None, token: str | None) -> None:
    """Snapshot Sandbox NAME now, journaled like the snapshots every spec.snapshotEveryNCalls calls: after a loss the
    Sandbox is restored from it. Prints the snapshot's id and how many calls it holds."""
    from durable_sandbox.client import SandboxCallError, SandboxClient
    from durable_sandbox.client.credentials import CredentialsError

    try:
        with SandboxClient.attach(name, namespace=settings.namespace, url=url, token=token) as box:
            taken = box.snapshot(operation_id=operation_id)
    except (SandboxCallError, CredentialsError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from None
    click.echo(f"{taken.snapshot_id}\t{taken.calls} calls{' (taken before: from the journal)' if taken.replayed else ''}")
