"""One small HTTP server for the operator (and a worker, ``dsb worker --metrics-port``): ``/metrics`` (Prometheus text exposition), ``/healthz`` (liveness)
and ``/readyz`` (readiness).

All on one port (the chart's ``metrics.port``), served by aiohttp on the operator's event loop: a probe
that gets an answer has also shown that the loop is not blocked. Ready means this replica serves Workflows:
from the end of its startup (discovery serves every resource, kopf is about to watch) until a stop begins
(SIGTERM: its runs are being handed over), so a rolling update sees the new Pod ready only once it serves.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)


class Exposition(Protocol):
    """What /metrics serves: the operator's (``OperatorMetrics``) or a worker's (``WorkerMetrics``) registry."""

    def generate(self) -> bytes: ...


# Returns None when healthy, else why not (sent with a 503).
HealthCheck = Callable[[], Awaitable[str | None]]


@dataclass
class Readiness:
    """Why this replica is not ready (None: ready); set by the operator's application (kube/process/application.py) at the
    end of its start and when a stop begins."""

    problem: str | None = "starting"

    def ready(self) -> None:
        self.problem = None

    def not_ready(self, why: str) -> None:
        self.problem = why


@dataclass
class MetricsServer:
    runner: web.AppRunner
    host: str
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


def make_app(
    metrics: Exposition, health: HealthCheck | None = None, readiness: Readiness | None = None
) -> web.Application:
    ready = readiness if readiness is not None else Readiness(problem=None)

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=metrics.generate(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz_handler(_: web.Request) -> web.Response:
        problem = await health() if health is not None else None
        if problem:
            return web.Response(status=503, text=f"unhealthy: {problem}\n")
        return web.Response(text="ok\n")

    async def readyz_handler(_: web.Request) -> web.Response:
        if ready.problem:
            return web.Response(status=503, text=f"not ready: {ready.problem}\n")
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz_handler)
    app.router.add_get("/readyz", readyz_handler)
    return app


async def start_metrics_server(
    metrics: Exposition, *, port: int, host: str = "0.0.0.0", health: HealthCheck | None = None,
    readiness: Readiness | None = None,
) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` (port 0: any free port; the bound one is
    returned). Without ``readiness`` /readyz answers ready."""
    runner = web.AppRunner(make_app(metrics, health, readiness), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(
            exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror}; choose another --metrics-port"
        ) from exc
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    log.info("serving /metrics, /healthz and /readyz on %s:%d", host, bound)
    return MetricsServer(runner=runner, host=host, port=bound)
