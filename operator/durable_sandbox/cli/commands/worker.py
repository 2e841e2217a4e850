"""`dsb worker`: execute runnable runs of the local store (pending, due timers, orphaned by a dead process)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import signal
from collections.abc import Iterator

import click

from durable_sandbox.cli import render
from durable_sandbox.cli.commands.common import pass_settings, run_async
from durable_sandbox.cli.commands.schedule import book_of, submit_tick
from durable_sandbox.cli.commands.schedule import report as schedule_report
from durable_sandbox.cli.commands.worker_metrics import serving_metrics
from durable_sandbox.cli.schedule_book import run_due
from durable_sandbox.engine import Engine, RunRecord
from durable_sandbox.engine.builds import BUILD_ENV, build_from_env
from durable_sandbox.runs.errors import EXIT_OK
from durable_sandbox.runs.session import open_engine
from durable_sandbox.runs.settings import Settings


@click.command()
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 256), help="Runs executed at once.")
@click.option("--poll-interval", default=0.5, show_default=True, type=click.FloatRange(0.01, 60.0),
              help="Seconds between looks for runnable runs.")
@click.option("--workflow", "workflows", multiple=True, help="Only runs of this workflow (repeatable).")
@click.option("--until-idle", is_flag=True, help="Exit once nothing is runnable (instead of serving until Ctrl-C).")
@click.option("--schedules", is_flag=True, help="Also create the runs of `dsb schedule` that fall due (every poll).")
@click.option("--queue", default=None, metavar="QUEUE",
              help="With --kube: execute the runs of the namespace's Workflows whose spec.worker.queue is QUEUE.")
@click.option("--lease-seconds", default=None, type=click.FloatRange(2.0, 600.0),
              help="With --kube --queue: run lease TTL, how long a dead worker's runs (and its heartbeat) wait before "
                   "another worker takes them over [default: 15].")
@click.option("--build-id", default=None, metavar="ID",
              help=f"This worker's build (default ${BUILD_ENV}; neither: unversioned). A run is pinned to the build "
                   "that started it; workers of other builds leave it alone unless its workflow is "
                   "versioning='auto-upgrade'.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve the worker's Prometheus metrics (/metrics; /healthz, /readyz) on this port (0: any free "
                   "one). Needs the Kubernetes extra.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address for --metrics-port (0.0.0.0 to be scraped from elsewhere, as the worker chart does).")
@pass_settings
def worker(settings: Settings, concurrency: int, poll_interval: float, workflows: tuple[str, ...], until_idle: bool,
           schedules: bool, queue: str | None, lease_seconds: float | None, build_id: str | None,
           metrics_port: int | None, metrics_host: str) -> None:
    """Execute runnable runs: pending ones, runs whose durable timer is due, runs a dead process left behind.

    Workflows are imported by the path their runs recorded (run it from the directory your code imports
    from): a run whose module it cannot import is skipped with a warning and left as it is. Waiting runs
    that hold a sandbox are hibernated after the engine's hibernate_after.

    With --kube --queue QUEUE [-n NS]: a cluster worker. It executes the runs of the Workflows of namespace NS
    (default: the Pod's, else the kubeconfig's) that name QUEUE in spec.worker, with this process's credentials
    and the namespace's worker key (Secret durable-sandbox-worker-key, which the operator writes).

    With a build id (--build-id or $DSB_BUILD_ID) the worker records it on the runs it starts and leaves runs
    pinned to another build to a worker of that build (docs/operations.md, "Versions in flight").

    With --metrics-port the worker serves its Prometheus metrics on /metrics: runs claimed, finished by outcome,
    steps committed, lease renewals failed, leases lost, runs skipped as another build's, labelled by its build
    id and queue (docs/operations.md, "A worker's metrics").
    """
    try:
        build = build_from_env(build_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--build-id / $" + BUILD_ENV) from None
    if queue is not None:  # `dsb --kube worker` without a queue is the local worker's usage error (open_engine)
        if not settings.kube:
            raise click.UsageError("a cluster worker needs both --kube and --queue QUEUE (the queue its "
                                   "Workflows name in spec.worker.queue)")
        from durable_sandbox.cli.commands.kube_worker import KUBE_WORKER_LEASE_SECONDS, serve_queue

        with _engine_warnings():
            executed = serve_queue(settings, queue, concurrency=concurrency, poll_interval=poll_interval,
                                   until_idle=until_idle, build=build, metrics=(metrics_port, metrics_host),
                                   lease_ttl=lease_seconds or KUBE_WORKER_LEASE_SECONDS)
        click.echo(f"worker executed {len(set(executed))} run(s)", err=True)
        click.get_current_context().exit(EXIT_OK)
    if lease_seconds is not None:
        raise click.UsageError("--lease-seconds is a cluster worker's (with --kube --queue QUEUE); the local worker's "
                               "runs are leased by the store's own settings")

    async def go() -> list[RunRecord]:
        # schedules make runs, and the store
        async with serving_metrics(metrics_port, metrics_host, build=build, queue="") as served, \
                open_engine(settings, create=schedules, extensions=[build] if build else [],
                            observer=served.observer) as engine:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, stop.set)
            version = f" (build {build.build_id})" if build else ""
            click.echo(f"worker {engine.worker_id}{version} serving {settings.store_label}", err=True)
            ticking = asyncio.create_task(_tick(settings, engine, stop, poll_interval)) if schedules else None
            executed = await engine.worker(
                concurrency=concurrency,
                poll_interval=poll_interval,
                workflows=list(workflows) or None,
                stop=stop,
                idle_exit=until_idle and not schedules,
            )
            if ticking is not None:
                ticking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticking
            # Each run once, as it stands now (a run woken twice was executed twice).
            return [await engine.client.get(run_id) for run_id in dict.fromkeys(executed)]

    with _engine_warnings():
        ran = run_async(go())
    # What it ran, and how each run stands: the worker's report (`dsb runs` lists the same way).
    if settings.output == "table":
        click.echo(f"worker executed {len(ran)} run(s)")
    render.render_runs(settings, ran, empty="")
    click.get_current_context().exit(EXIT_OK)


async def _tick(settings: Settings, engine: Engine, stop: asyncio.Event, poll_interval: float) -> None:
    """`--schedules`: the due runs of the schedules, made every poll until the worker stops (a failing turn is
    said, and tried again at the next poll)."""
    book = book_of(settings)
    while not stop.is_set():
        try:
            schedule_report(settings, await run_due(engine, book, dt.datetime.now(dt.UTC), submit_tick))
        except Exception as exc:
            click.echo(f"warning: schedules: {type(exc).__name__}: {exc}", err=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(poll_interval, 1.0))


class _Echo(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"{record.levelname.lower()}: {self.format(record)}", err=True)


@contextlib.contextmanager
def _engine_warnings() -> Iterator[None]:
    """What the engine warns of while the worker serves (a run it cannot import and skips, the store away)
    as `warning: ...` lines on stderr, as dsb says everything else."""
    logger = logging.getLogger("durable_sandbox")
    handler = _Echo(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
