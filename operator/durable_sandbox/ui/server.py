"""Serving the web view: the runs ``dsb`` would open (the local store, or with ``--kube`` the cluster),
behind :mod:`ui.security`, on uvicorn, until Ctrl-C."""

from __future__ import annotations

import contextlib
import re
import secrets
import socket
from collections.abc import AsyncIterator, Callable

import uvicorn

from durable_sandbox.runs.errors import CliError
from durable_sandbox.runs.session import Settings, cluster_module, open_engine
from durable_sandbox.ui.app import create_app
from durable_sandbox.ui.local import LocalSource
from durable_sandbox.ui.security import Guard, is_loopback
from durable_sandbox.ui.source import RunSource

__all__ = ["bind", "check_token", "open_source", "serve"]

TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9._~-]{16,}$")


def check_token(host: str, token: str | None) -> str:
    """The token to require: the one given, or on loopback a new random one; elsewhere one must be given."""
    if token is None:
        if not is_loopback(host):
            raise CliError(
                f"--host {host} is not a loopback address: anyone who can reach it could read your runs, so dsb ui "
                f"needs a token: --token TOKEN or $DSB_UI_TOKEN (16 or more of A-Z a-z 0-9 . _ ~ -), e.g. "
                f"--token {secrets.token_urlsafe(24)}"
            )
        return secrets.token_urlsafe(24)
    if not TOKEN_PATTERN.match(token):
        raise CliError("--token: use 16 or more characters of A-Z a-z 0-9 . _ ~ - (it travels in a URL and a cookie)")
    return token


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise CliError(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror} (--port 0 picks a free port)") from None
    sock.listen(128)
    return sock


@contextlib.asynccontextmanager
async def open_source(settings: Settings) -> AsyncIterator[RunSource]:
    """The runs the other `dsb` commands would work on, opened as they open them."""
    if settings.kube:
        from durable_sandbox.ui.cluster import ClusterSource

        async with cluster_module().ClusterEngine.open(settings) as cluster:
            yield ClusterSource(cluster)
        return
    async with open_engine(settings) as engine:
        yield LocalSource(engine, settings)


async def serve(settings: Settings, *, host: str, port: int, token: str | None, allow_actions: bool,
                echo: Callable[[str], None]) -> None:  # fmt: skip
    token = check_token(host, token)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    guard = Guard(host=host, port=bound, token=token, allow_actions=allow_actions)
    async with open_source(settings) as source:
        app = create_app(source, guard)
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, server_header=False,
                                proxy_headers=False, timeout_graceful_shutdown=2)  # fmt: skip
        server = uvicorn.Server(config)
        shown = f"[{host}]" if ":" in host else host
        echo(f"dsb ui: http://{shown}:{bound}/runs?token={token}")
        echo(f"  {source.where()}; {'actions allowed' if allow_actions else 'read-only'}; Ctrl-C stops it")
        await server.serve(sockets=[sock])
