"""`dsb worker --metrics-port`: the worker's Prometheus metrics served on /metrics while it works
(``kube/telemetry/worker_metrics.py``; the same small server as the operator's, with /healthz and /readyz)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import click

from durable_sandbox.engine.builds import WorkerBuild
from durable_sandbox.engine.observed_store import WorkerObserver

__all__ = ["ServedMetrics", "serving_metrics"]


@dataclass(frozen=True)
class ServedMetrics:
    """What the worker tells its metrics (``observer``: None when none are served) and where they are served."""

    observer: WorkerObserver | None = None
    url: str | None = None


@contextlib.asynccontextmanager
async def serving_metrics(port: int | None, host: str, *, build: WorkerBuild | None,
                          queue: str) -> AsyncIterator[ServedMetrics]:
    """The worker's metrics, served on ``host:port`` (0: any free port) until the block ends; nothing served
    without a port. ``queue`` is empty for a local worker."""
    if port is None:
        yield ServedMetrics()
        return
    try:
        from durable_sandbox.kube.telemetry.metrics_server import start_metrics_server
        from durable_sandbox.kube.telemetry.worker_metrics import WorkerMetrics
    except ImportError as exc:
        raise click.ClickException(
            f"--metrics-port needs the Kubernetes extra (prometheus-client, aiohttp): "
            f"pip install 'durable-sandbox[kubernetes]' ({exc})") from None
    metrics = WorkerMetrics(build=build.build_id if build else "", queue=queue)
    try:
        server = await start_metrics_server(metrics, port=port, host=host)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    url = f"http://{host}:{server.port}/metrics"
    click.echo(f"worker metrics on {url}", err=True)
    try:
        yield ServedMetrics(metrics, url)
    finally:
        await server.stop()
