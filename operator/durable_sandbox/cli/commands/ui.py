"""`dsb ui`: the web view of runs (the server is :mod:`durable_sandbox.ui`)."""

from __future__ import annotations

import asyncio

import click

from durable_sandbox.cli.commands.common import pass_settings
from durable_sandbox.runs.session import Settings


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --token.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Port (0: a free one).")
@click.option("--token", envvar="DSB_UI_TOKEN", metavar="TOKEN",
              help="Token the pages require [default: a random one on loopback]; env DSB_UI_TOKEN.")
@click.option("--allow-actions", is_flag=True,
              help="Offer signal, cancel, suspend and resume (default: read-only).")
@pass_settings
def ui(settings: Settings, host: str, port: int, token: str | None, allow_actions: bool) -> None:
    """Serve a web view of the runs: the list, each run's timeline of every call, snapshot, loss and
    recovery, its pending callbacks, and the sandboxes. Prints its URL (with the token) and runs until Ctrl-C.

    The same runs the other commands see: the local store, or with --kube the cluster's Workflows through
    your kubeconfig. Read-only unless --allow-actions; every action asks for confirmation and does what
    `dsb signal`/`cancel`/`resume` do locally, or patches the Workflow's spec in a cluster.
    """
    from durable_sandbox.ui.server import serve

    def echo(line: str) -> None:
        click.echo(line, err=False)

    try:
        asyncio.run(serve(settings, host=host, port=port, token=token, allow_actions=allow_actions, echo=echo))
    except KeyboardInterrupt:
        pass
