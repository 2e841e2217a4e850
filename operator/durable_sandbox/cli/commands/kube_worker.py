"""`dsb worker --kube --queue QUEUE`: execute the runs of a namespace's Workflows that name QUEUE in spec.worker,
with this process's credentials (a Pod's ServiceAccount, or the kubeconfig's) and the namespace's worker key."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import click

from durable_sandbox.cli.commands.worker_metrics import serving_metrics
from durable_sandbox.engine.builds import WorkerBuild
from durable_sandbox.runs.settings import Settings

__all__ = ["KUBE_WORKER_LEASE_SECONDS", "serve_queue"]

KUBE_WORKER_LEASE_SECONDS = 15.0  # `--lease-seconds`' default: a dead worker's runs are taken over after this long


def serve_queue(settings: Settings, queue: str, *, concurrency: int, poll_interval: float, until_idle: bool,
                build: WorkerBuild | None = None, metrics: tuple[int | None, str] = (None, "127.0.0.1"),
                lease_ttl: float = KUBE_WORKER_LEASE_SECONDS) -> list[str]:
    """Serve until SIGTERM/SIGINT (every run handed over at its next step boundary) or, ``until_idle``, until
    nothing of the queue is due; the run ids executed. ``metrics``: the port (None: none) and address of its
    /metrics."""
    from durable_sandbox.kube.journal.journal_key import own_namespace
    from durable_sandbox.kube.workers.start import open_worker
    from durable_sandbox.runs.cluster import default_namespace

    namespace = settings.namespace or own_namespace() or default_namespace()

    async def go() -> list[str]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        async with serving_metrics(*metrics, build=build, queue=queue) as served, \
                open_worker(namespace, queue, stop, concurrency=concurrency, poll=poll_interval, build=build, lease_ttl=lease_ttl,
                            say=lambda line: click.echo(line, err=True), observer=served.observer) as worker:
            if worker is None:
                return []
            version = f" (build {build.build_id})" if build else ""
            click.echo(f"worker {worker.engine.worker_id}{version} serving queue {queue} in namespace {namespace}",
                       err=True)
            return await worker.serve(stop, until_idle=until_idle)

    from durable_sandbox.kube.api.client import ApiException
    from durable_sandbox.kube.journal.worker_key import WorkerKeyError

    try:
        return asyncio.run(go())
    except WorkerKeyError as exc:
        raise click.ClickException(str(exc)) from None
    except ApiException as exc:
        if exc.status not in (401, 403):
            raise
        raise click.ClickException(
            f"the worker's credentials were refused in namespace {namespace} ({exc.status} {exc.reason}): a worker "
            f"reads its namespace's Workflows and writes its runs' Journal objects and its heartbeat Lease there "
            f"only; grant its ServiceAccount the worker Role of docs/kubernetes.md in {namespace}") from None
