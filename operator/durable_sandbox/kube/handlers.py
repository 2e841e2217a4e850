"""kopf registration and settings: the only module of the package that imports kopf.

What kopf does for us: watch Workflows (with a server-side watch timeout, so a silently dead watch is
replaced) and hand every event, the initial listing included, to the application (:meth:`Operator.notice`); keep the
``durable-sandbox.dev/cleanup`` finalizer and call the delete handler with retries; answer a liveness
probe. Everything else is :mod:`kube.controller`, which drives a run in a task of its own only while the
run has work, and parks it (no task) while it waits: no kopf daemon per Workflow, so a thousand waiting
Workflows cost a thousand small records, not a thousand tasks (docs/benchmarks.md). Sandbox resources keep
one daemon each (they renew provider leases for as long as they live).

Settings, and why:
- standalone peering: every replica serves every Workflow; the per-run Lease decides who executes
  (kopf's own peering would make the replicas active-passive).
- progress and diff-base storage in ``status.kopf``: no ``kopf.zalando.org/*`` annotations on users'
  objects (they break GitOps diffs and hit the 256 KiB annotation limit on big specs).
- kopf's own Events off: the operator writes lifecycle Events itself (de-duplicated, never per call,
  never a traceback that could carry a secret).
- resources read from discovery once, at start, and only once discovery serves them all
  (``settings.scanning.disabled`` and :func:`kube.discovery.wait_until_served`): kopf otherwise reads
  discovery again on every CRD event and drops a resource an API server that has just restarted does not
  list yet, serving no Workflow until the next CRD event (docs/reliability.md). Our CRDs are installed with
  the chart, not discovered at run time; the chart's RBAC has no CRD or namespace access either. Should the
  API server restart between that wait and kopf's read (milliseconds), kopf says so in its log and
  :class:`UnservedResourcesGuard` stops the operator with an error, so that it is restarted (a Pod is).

What the process runs is one object, :class:`~durable_sandbox.kube.process.application.OperatorApplication`, handed to
kopf as its memo by :func:`run`: every handler here reads it from there (``memo``), and nothing here is a module
global that changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import kopf

from durable_sandbox.kube.api.errors import CleanupPending
from durable_sandbox.kube.api.resources import (
    FINALIZER,
    GROUP,
    POOLS,
    SANDBOXES,
    SCHEDULES,
    VERSION,
    WORKFLOWS,
)
from durable_sandbox.kube.process.application import OperatorApplication
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics

log = logging.getLogger("durable_sandbox.kube.handlers")

WATCH_SERVER_TIMEOUT = 300  # seconds the API server keeps one watch open before kopf starts the next
WATCH_CLIENT_TIMEOUT = 330
# A stopping daemon (Workflow deleted, operator exiting) is given this long to hand its run over or cancel
# it (the call in flight may finish first; sandbox cleanup runs) before kopf cancels it by force.
DAEMON_GRACEFUL_EXIT = 60.0
DAEMON_CANCELLATION_TIMEOUT = 30.0
# How long kopf waits, within the handling cycle of a deletion, for a daemon it has just told to stop. A
# finished run's daemon ends after at most one status write, so its finalizer goes in that same cycle;
# without this kopf allows 10 event-loop turns, which a daemon that writes anything on its way out misses.
DAEMON_INSTANT_EXIT = 5.0
GRACEFUL_STOP_INSTALL_DELAY = 0.5  # seconds after startup: kopf's own signal handlers are in place by then
MEMO_KEY = "application"  # where kopf's memo holds the application

Touch = Callable[[], Coroutine[Any, Any, None]]


def application(memo: Any) -> OperatorApplication:
    """The application kopf's ``memo`` carries (:func:`run` put it there)."""
    app = memo.get(MEMO_KEY) if isinstance(memo, dict) else None
    if not isinstance(app, OperatorApplication):
        raise RuntimeError("kopf's memo holds no operator application: start the operator with kube.handlers.run(app)")
    return app


# The spec fields kopf's diff-base keeps: the ones that steer a run. The program (toolCalls: up to 10,000) would
# make status.kopf.diffbase as large as the spec, far past the 64 KiB status budget (a 10,000-call spec is
# ~650 KB); it is immutable after creation (admission) and no handler here reacts to a diff of it.
DIFFBASE_SPEC_FIELDS = frozenset({"suspend", "cancel", "signals", "ttlSecondsAfterFinished", "timeoutSeconds"})


class SteeringDiffBase(kopf.StatusDiffBaseStorage):
    """kopf's diff-base in ``status.kopf.diffbase``, without the program, and with a digest of each signal
    value instead of the value: a copy of the signals in status would double the object's share of them, and
    a big one (whatever a user wrote in spec, even one the operator refuses) would push the object past the
    API server's size limit, after which no status write, finalizer removal included, could land."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        mapping = cast(dict[str, Any], essence)
        spec = mapping.get("spec")
        if isinstance(spec, dict):
            mapping["spec"] = {k: v for k, v in spec.items() if k in DIFFBASE_SPEC_FIELDS}
            signals = mapping["spec"].get("signals")
            if isinstance(signals, dict):
                mapping["spec"]["signals"] = {k: _digest(v) for k, v in signals.items()}
        return essence


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    settings.peering.standalone = True
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = SteeringDiffBase(field="status.kopf.diffbase")
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT
    settings.posting.enabled = False
    settings.background.instant_exit_timeout = DAEMON_INSTANT_EXIT
    settings.scanning.disabled = True


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure_kopf(settings)
    app = application(memo)
    # kopf installs its own SIGTERM/SIGINT handlers as it starts (they stop everything within seconds); the
    # application's replace them once it has: runs are handed over first, then kopf is stopped.
    asyncio.get_running_loop().call_later(GRACEFUL_STOP_INSTALL_DELAY, app.take_signals)
    try:
        await app.start()
    except asyncio.CancelledError:
        # Stopped while starting (e.g. SIGTERM while it waits for the API server to serve its kinds): kopf runs
        # no cleanup activity after a cancelled startup, so what the start opened is closed here.
        await asyncio.shield(app.close())
        raise


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await application(memo).close()


async def until_stopped(stopped: kopf.DaemonStopped, serve: Callable[[asyncio.Event], Awaitable[None]],
                        kind: str = "Sandbox", *, touch: Touch, metrics: OperatorMetrics,
                        background: set[asyncio.Task[Any]]) -> None:
    """Run a daemon body with an asyncio.Event set once kopf stops the daemon (the object is being
    deleted, or the operator is exiting: runs are handed over, Sandboxes left as they are). ``touch``
    makes kopf look at the object again after a deletion (see :func:`look_again_when_ended`), in a task
    kept in ``background``; a failure of the body is counted in ``metrics``."""
    look_again_when_ended(stopped, touch, background)
    stop = asyncio.Event()

    async def bridge() -> None:
        await stopped.wait()
        stop.set()

    watcher = asyncio.create_task(bridge())
    try:
        await serve(stop)
    except Exception:
        metrics.reconcile_errors.labels(kind=kind).inc()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def kopf_must_look_again(reason: kopf.DaemonStoppingReason | None) -> bool:
    """Whether kopf, stopping a daemon for its object's deletion, may have found it still running: then it
    looks at the object again only on its next event, or when the graceful backoff (DAEMON_GRACEFUL_EXIT) is
    over. kopf marks a daemon DAEMON_SIGNALLED (later DAEMON_CANCELLED) when it did not end within kopf's
    first wait; if it ended within the second, the look again is one needless write."""
    if reason is None or not reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
        return False
    return bool(reason & (kopf.DaemonStoppingReason.DAEMON_SIGNALLED | kopf.DaemonStoppingReason.DAEMON_CANCELLED))


def look_again_when_ended(stopped: kopf.DaemonStopped, touch: Touch, background: set[asyncio.Task[Any]]) -> None:
    """Once the current (daemon) task has ended, make kopf look at its object again if it needs to.

    kopf removes the finalizer of a deleted object only in a handling cycle that finds all its daemons
    ended, and a daemon ending is no watch event. A daemon that outlives kopf's wait (DAEMON_INSTANT_EXIT)
    would otherwise keep the finalizer until the next event of the object, or DAEMON_GRACEFUL_EXIT seconds,
    which is exactly `kubectl delete`'s usual 60 s timeout. ``touch`` (a write of kopf's own
    ``status.kopf.dummy``) runs from the task's done callback, strictly after the task ended, so the
    handling cycle its event causes finds the daemon gone."""
    task = asyncio.current_task()
    if task is None:
        return

    def ended(_: asyncio.Task[Any]) -> None:
        if not kopf_must_look_again(stopped.reason):
            return
        follow_up = asyncio.get_running_loop().create_task(touch())
        background.add(follow_up)
        follow_up.add_done_callback(background.discard)

    task.add_done_callback(ended)


def toucher(app: OperatorApplication, plural: str, body: kopf.Body) -> Touch:
    """A write that changes nothing but kopf's ``status.kopf.dummy`` (as kopf's own touch does): an event."""
    meta = body.get("metadata", {})
    namespace, name = meta.get("namespace", ""), meta.get("name", "")

    async def touch() -> None:
        if app.stopped:
            return  # the operator is exiting
        stamp = datetime.datetime.now(datetime.UTC).isoformat()
        try:
            # Answers None when it is gone: kopf let it go already.
            await app.workflows.objects.patch_status(plural, namespace, name, {"kopf": {"dummy": stamp}})
        except Exception as exc:
            log.warning("could not ask kopf to look at %s %s/%s again (%s): its finalizer goes when the daemon's "
                        "graceful backoff of %gs is over", plural, namespace, name, exc, DAEMON_GRACEFUL_EXIT)

    return touch


def _daemon(app: OperatorApplication, stopped: kopf.DaemonStopped, serve: Callable[[asyncio.Event], Awaitable[None]],
            kind: str, plural: str, body: kopf.Body) -> Awaitable[None]:
    return until_stopped(stopped, serve, kind=kind, touch=toucher(app, plural, body), metrics=app.metrics,
                         background=app.background)


@kopf.on.event(GROUP, VERSION, WORKFLOWS)
async def watched(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    application(memo).workflow_event(body, deleted=type == "DELETED")


@kopf.on.delete(GROUP, VERSION, WORKFLOWS, optional=False, retries=None)
async def delete(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    app = application(memo)
    await _finalize(app, "Workflow", app.workflows.cleanup(body, attempt=retry))


async def _finalize(app: OperatorApplication, kind: str, cleanup: Awaitable[None]) -> None:
    """A delete handler's cleanup. CleanupPending (the provider refuses, another replica holds the run) is
    retried by kopf after its delay; anything else is a reconcile error, which kopf retries too."""
    try:
        await cleanup
    except CleanupPending as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from None
    except Exception:
        app.metrics.reconcile_errors.labels(kind=kind).inc()
        raise


@kopf.daemon(GROUP, VERSION, SANDBOXES, cancellation_backoff=DAEMON_GRACEFUL_EXIT,
             cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT)
async def keep_sandbox(body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    # One daemon per Sandbox: provisions, renews the provider lease, suspends and restores it.
    app = application(memo)
    controller = app.sandboxes
    await _daemon(app, stopped, lambda stop: controller.daemon(lambda: body, stop), "Sandbox", SANDBOXES, body)


@kopf.on.event(GROUP, VERSION, SANDBOXES)
async def sandbox_watched(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    application(memo).sandbox_event(body)


@kopf.on.delete(GROUP, VERSION, SANDBOXES, optional=False, retries=None)
async def delete_sandbox(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    app = application(memo)
    await _finalize(app, "Sandbox", app.sandboxes.cleanup(body, attempt=retry))


@kopf.daemon(GROUP, VERSION, POOLS, cancellation_backoff=DAEMON_GRACEFUL_EXIT,
             cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT)
async def keep_pool(body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    # One daemon per SandboxPool: keeps its warm Pods (in the replica holding the pool's lease).
    app = application(memo)
    controller = app.pools
    await _daemon(app, stopped, lambda stop: controller.daemon(lambda: body, stop), "SandboxPool", POOLS, body)


@kopf.on.event(GROUP, VERSION, POOLS)
async def pool_watched(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    application(memo).pool_event(body)


@kopf.on.delete(GROUP, VERSION, POOLS, optional=False, retries=None)
async def delete_pool(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    app = application(memo)
    await _finalize(app, "SandboxPool", app.pools.cleanup(body))


@kopf.daemon(GROUP, VERSION, SCHEDULES, cancellation_backoff=DAEMON_GRACEFUL_EXIT,
             cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT)
async def keep_schedule(body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    # One daemon per WorkflowSchedule: makes its ticks' Workflows (in the replica holding the schedule's lease).
    app = application(memo)
    controller = app.schedules
    await _daemon(app, stopped, lambda stop: controller.daemon(lambda: body, stop), "WorkflowSchedule", SCHEDULES,
                  body)


@kopf.on.event(GROUP, VERSION, SCHEDULES)
async def schedule_watched(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    application(memo).schedule_event(body)


# kopf (1.45) logs these, from this logger, when reading discovery leaves a resource of a handler unserved;
# relied on by UnservedResourcesGuard, pinned by tests/e2e/test_operator_apiserver_restart.py.
KOPF_OBSERVATION_LOGGER = "kopf._core.reactor.observation"
KOPF_UNSERVED = ("Unresolved resources cannot be served", "Non-watchable resources will not be served",
                 "Non-patchable resources will not be served")
UNSERVED_STOP = "kopf does not serve this operator's resources"  # how that stop's log line begins


class UnservedResourcesGuard(logging.Handler):
    """Stops the operator when kopf's one read of discovery left Workflows or Sandboxes unserved.

    With scanning off kopf never reads discovery again, so such an operator would serve nothing for good: it
    is stopped instead (``dsb operator`` exits 1 saying why) and restarted by whoever runs it; its next start
    waits for discovery again (:func:`kube.discovery.wait_until_served`)."""

    def __init__(self, app: OperatorApplication) -> None:
        super().__init__(logging.WARNING)
        self.app = app

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.startswith(KOPF_UNSERVED) or GROUP not in message:
            return
        self.app.stop_unserved(f"{UNSERVED_STOP}: the API server's discovery did not list them when kopf read it (an "
                               f"API server restarting just then?); restart the operator. kopf said: {message}")


def run(app: OperatorApplication, *, liveness: str | None) -> str | None:
    """Run the operator ``app`` until SIGINT/SIGTERM (runs are handed over to other replicas, then kopf stops).
    Returns None then, or why it stopped on its own (kopf does not serve its resources: UnservedResourcesGuard)."""
    namespaces = list(app.config.namespaces)
    observation = logging.getLogger(KOPF_OBSERVATION_LOGGER)
    guard = UnservedResourcesGuard(app)
    observation.addHandler(guard)
    try:
        kopf.run(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
            stop_flag=app.stop_flag,
            memo=kopf.Memo({MEMO_KEY: app}),
        )
    finally:
        observation.removeHandler(guard)
    return app.unserved
