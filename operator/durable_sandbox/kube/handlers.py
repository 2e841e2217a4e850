"""kopf registration and settings: the only module of the package that imports kopf.

What kopf does for us: watch Workflows (with a server-side watch timeout, so a silently dead watch is
replaced) and hand every event, the initial listing included, to :meth:`Operator.notice`; keep the
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

``STARTUP_HOOKS``: functions ``hook(operator, settings)`` (async or not) run once the operator is
configured and before any Workflow is served: the place for the metrics and health endpoint.
``SHUTDOWN_HOOKS``: coroutine functions run last when the operator stops, after its runs were handed over
(the metrics and health endpoint stops there: it answers while the runs are handed over).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import inspect
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from durable_sandbox.kube.apiserver_away import API_AWAY
from durable_sandbox.kube.client import KubeClient
from durable_sandbox.kube.controller import Operator, OperatorPolicy, OperatorSettings
from durable_sandbox.kube.discovery import Wanted, list_one, wait_until_served
from durable_sandbox.kube.errors import CleanupPending
from durable_sandbox.kube.journals import ApiServerJournal, JournalChoice, open_journal
from durable_sandbox.kube.metrics import METRICS
from durable_sandbox.kube.metrics_server import READINESS
from durable_sandbox.kube.pool import PoolController, PoolSettings
from durable_sandbox.kube.resources import FINALIZER, GROUP, POOLS, SANDBOXES, VERSION, WORKFLOWS
from durable_sandbox.kube.sandbox import SandboxController, SandboxControllerSettings
from durable_sandbox.kube.sweeper import OrphanSweeper
from durable_sandbox.providers.kubernetes_egress import egress_notice

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

StartupHook = Callable[[Operator, kopf.OperatorSettings], Any]
ShutdownHook = Callable[[], Awaitable[None]]
Touch = Callable[[], Coroutine[Any, Any, None]]
STARTUP_HOOKS: list[StartupHook] = []
SHUTDOWN_HOOKS: list[ShutdownHook] = []


@dataclass
class Configuration:
    """What `dsb operator` was started with (set before kopf runs)."""

    policy: OperatorPolicy = field(default_factory=OperatorPolicy)
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    kubeconfig: str | None = None
    providers: Any = None
    namespaces: list[str] = field(default_factory=list)  # served namespaces; empty: every namespace
    journal_key: bytes | None = field(default=None, repr=False)  # kube/journal_key.py; never printed
    journal: JournalChoice = field(default_factory=ApiServerJournal)  # where runs' journals go (kube/journals.py)
    # Makes the kubernetes provider for SandboxPools' Pods (with the pool key); None: pools say the provider is off.
    pool_provider: Callable[[], Any] | None = None


config = Configuration()
_operator: Operator | None = None
_sandboxes: SandboxController | None = None
_pools: PoolController | None = None
_sweep: tuple[asyncio.Task[None], asyncio.Event, dict[str, Any]] | None = None  # task, stop, its providers


def current() -> Operator:
    if _operator is None:
        raise RuntimeError("the operator is not started (kopf's startup handler has not run)")
    return _operator


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
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _operator, _sandboxes, _pools
    configure_kopf(settings)
    api = await KubeClient.connect(kubeconfig=config.kubeconfig)
    journals = await open_journal(config.journal, api, journal_key=config.journal_key)
    _operator = Operator(api, policy=config.policy, settings=config.settings, providers=config.providers,
                         journal_key=config.journal_key, journals=journals)
    _sandboxes = SandboxController(api, _operator.events, _operator.provider_for, SandboxControllerSettings(
        worker_id=config.settings.worker_id, lease_ttl=config.settings.lease_ttl,
        default_provider=config.policy.default_provider, allow_local_provider=config.policy.allow_local_provider),
        labels=_operator.sandbox_labels, records=_operator.records, holding=_operator.holding)
    _pools = PoolController(api, config.pool_provider, METRICS, PoolSettings(
        worker_id=config.settings.worker_id, lease_ttl=config.settings.lease_ttl))
    for hook in STARTUP_HOOKS:
        result = hook(_operator, settings)
        if inspect.isawaitable(result):
            await result
    # kopf installs its own SIGTERM/SIGINT handlers as it starts (they stop everything within seconds);
    # ours replace them once it has: runs are handed over first, then kopf is stopped (_graceful_stop).
    asyncio.get_running_loop().call_later(GRACEFUL_STOP_INSTALL_DELAY, _install_graceful_stop)
    # kopf reads discovery once, right after this handler returns (scanning is disabled): only once it is complete,
    # and once the resources' storage answers a LIST (else kopf's first watches meet a 429 "storage is
    # (re)initializing", as does the orphan sweep's first round).
    wanted = Wanted(namespace=config.namespaces[0] if config.namespaces else None)
    await wait_until_served(api, wanted)
    API_AWAY.configure(lambda: list_one(api, wanted, WORKFLOWS))
    _start_sweep(api, _operator)
    READINESS.ready()
    log.info("operator %s serving Workflows (default provider %s; local provider %s; workflow modules: %s; journal "
             "in %s)", config.settings.worker_id, config.policy.default_provider,
             "allowed" if config.policy.allow_local_provider else "refused",
             ", ".join(config.policy.workflow_modules) or "none", config.journal)
    if "kubernetes" in _operator.engines.usable_provider_names():
        log.log(*egress_notice(os.environ))


def _sweep_providers(op: Operator, cache: dict[str, Any]) -> dict[str, Any]:
    """The providers this operator may use and can build (configured), one instance each for all sweeps."""
    for name in op.engines.usable_provider_names():
        if name in cache:
            continue
        try:
            cache[name] = op.provider_for(name)
        except Exception as exc:  # a provider that cannot be built now is tried again next sweep
            log.warning("orphan sweep: provider %s unavailable (%s)", name, exc)
    return cache


def _start_sweep(api: KubeClient, op: Operator) -> None:
    global _sweep
    settings = op.settings
    if settings.sweep_interval <= 0:
        return
    cache: dict[str, Any] = {}
    sweeper = OrphanSweeper(api, installation=settings.installation_id, namespaces=list(config.namespaces),
                            providers=lambda: _sweep_providers(op, cache), grace=settings.sweep_grace,
                            events=op.events, metrics=METRICS, records=op.records,
                            finished_runs=op.engines.journals.finished_run_keys)
    stop = asyncio.Event()
    _sweep = (asyncio.create_task(sweeper.run(settings.sweep_interval, stop)), stop, cache)
    log.info("orphan sweep every %gs (grace %gs) for installation %s", settings.sweep_interval, settings.sweep_grace,
             settings.installation_id)


async def _stop_sweep() -> None:
    global _sweep
    if _sweep is None:
        return
    (task, stop, providers), _sweep = _sweep, None
    stop.set()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)
    for provider in providers.values():
        with contextlib.suppress(Exception):
            await provider.aclose()


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    global _operator, _sandboxes, _pools
    try:
        await API_AWAY.aclose()
        await _stop_sweep()
        if _operator is None:
            return
        op, _operator = _operator, None
        if _sandboxes is not None:
            await _sandboxes.aclose()
            _sandboxes = None
        if _pools is not None:
            await _pools.aclose()
            _pools = None
        await op.shutdown()
        await op.aclose()
        await op.api.close()
    finally:
        for hook in SHUTDOWN_HOOKS:
            try:
                await hook()
            except Exception as exc:  # the process is exiting: say so, and run the other hooks
                log.warning("a shutdown hook failed: %s: %s", type(exc).__name__, exc)


async def until_stopped(stopped: kopf.DaemonStopped, serve: Callable[[asyncio.Event], Awaitable[None]],
                        kind: str = "Sandbox", *, touch: Touch) -> None:
    """Run a daemon body with an asyncio.Event set once kopf stops the daemon (the object is being
    deleted, or the operator is exiting: runs are handed over, Sandboxes left as they are). ``touch``
    makes kopf look at the object again after a deletion (see :func:`look_again_when_ended`)."""
    look_again_when_ended(stopped, touch)
    stop = asyncio.Event()

    async def bridge() -> None:
        await stopped.wait()
        stop.set()

    watcher = asyncio.create_task(bridge())
    try:
        await serve(stop)
    except Exception:
        METRICS.reconcile_errors.labels(kind=kind).inc()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


_touches: set[asyncio.Task[None]] = set()


def kopf_must_look_again(reason: kopf.DaemonStoppingReason | None) -> bool:
    """Whether kopf, stopping a daemon for its object's deletion, may have found it still running: then it
    looks at the object again only on its next event, or when the graceful backoff (DAEMON_GRACEFUL_EXIT) is
    over. kopf marks a daemon DAEMON_SIGNALLED (later DAEMON_CANCELLED) when it did not end within kopf's
    first wait; if it ended within the second, the look again is one needless write."""
    if reason is None or not reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
        return False
    return bool(reason & (kopf.DaemonStoppingReason.DAEMON_SIGNALLED | kopf.DaemonStoppingReason.DAEMON_CANCELLED))


def look_again_when_ended(stopped: kopf.DaemonStopped, touch: Touch) -> None:
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
        _touches.add(follow_up)
        follow_up.add_done_callback(_touches.discard)

    task.add_done_callback(ended)


def toucher(plural: str, body: kopf.Body) -> Touch:
    """A write that changes nothing but kopf's ``status.kopf.dummy`` (as kopf's own touch does): an event."""
    meta = body.get("metadata", {})
    namespace, name = meta.get("namespace", ""), meta.get("name", "")

    async def touch() -> None:
        if _operator is None:
            return  # the operator is exiting
        stamp = datetime.datetime.now(datetime.UTC).isoformat()
        try:
            # Answers None when it is gone: kopf let it go already.
            await _operator.objects.patch_status(plural, namespace, name, {"kopf": {"dummy": stamp}})
        except Exception as exc:
            log.warning("could not ask kopf to look at %s %s/%s again (%s): its finalizer goes when the daemon's "
                        "graceful backoff of %gs is over", plural, namespace, name, exc, DAEMON_GRACEFUL_EXIT)

    return touch


@kopf.on.event(GROUP, VERSION, WORKFLOWS)
async def watched(body: kopf.Body, type: str | None, **_: Any) -> None:
    uid = body.get("metadata", {}).get("uid", "")
    if type == "DELETED":
        METRICS.forget_workflow(uid)
        if _operator is not None:
            _operator.forget(body)
        return
    METRICS.observe_workflow(uid, body.get("status"))
    if _operator is not None:
        _operator.notice(body)


@kopf.on.delete(GROUP, VERSION, WORKFLOWS, optional=False, retries=None)
async def delete(body: kopf.Body, retry: int, **_: Any) -> None:
    await _finalize("Workflow", current().cleanup(body, attempt=retry))


async def _finalize(kind: str, cleanup: Awaitable[None]) -> None:
    """A delete handler's cleanup. CleanupPending (the provider refuses, another replica holds the run) is
    retried by kopf after its delay; anything else is a reconcile error, which kopf retries too."""
    try:
        await cleanup
    except CleanupPending as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from None
    except Exception:
        METRICS.reconcile_errors.labels(kind=kind).inc()
        raise


def sandboxes() -> SandboxController:
    if _sandboxes is None:
        raise RuntimeError("the operator is not started (kopf's startup handler has not run)")
    return _sandboxes


@kopf.daemon(GROUP, VERSION, SANDBOXES, cancellation_backoff=DAEMON_GRACEFUL_EXIT,
             cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT)
async def keep_sandbox(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
    # One daemon per Sandbox: provisions, renews the provider lease, suspends and restores it.
    controller = sandboxes()
    await until_stopped(stopped, lambda stop: controller.daemon(lambda: body, stop), kind="Sandbox",
                        touch=toucher(SANDBOXES, body))


@kopf.on.event(GROUP, VERSION, SANDBOXES)
async def sandbox_watched(body: kopf.Body, **_: Any) -> None:
    if _sandboxes is not None:
        _sandboxes.notice(body)
    if _operator is not None:  # Workflows waiting for this Sandbox (spec.sandboxRef) look again
        _operator.sandbox_changed(body.get("metadata", {}).get("namespace", ""), body.get("metadata", {}).get("name", ""))


@kopf.on.delete(GROUP, VERSION, SANDBOXES, optional=False, retries=None)
async def delete_sandbox(body: kopf.Body, retry: int, **_: Any) -> None:
    await _finalize("Sandbox", sandboxes().cleanup(body, attempt=retry))


def pools() -> PoolController:
    if _pools is None:
        raise RuntimeError("the operator is not started (kopf's startup handler has not run)")
    return _pools


@kopf.daemon(GROUP, VERSION, POOLS, cancellation_backoff=DAEMON_GRACEFUL_EXIT,
             cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT)
async def keep_pool(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
    # One daemon per SandboxPool: keeps its warm Pods (in the replica holding the pool's lease).
    controller = pools()
    await until_stopped(stopped, lambda stop: controller.daemon(lambda: body, stop), kind="SandboxPool",
                        touch=toucher(POOLS, body))


@kopf.on.event(GROUP, VERSION, POOLS)
async def pool_watched(body: kopf.Body, **_: Any) -> None:
    if _pools is not None:
        _pools.notice(body)


@kopf.on.delete(GROUP, VERSION, POOLS, optional=False, retries=None)
async def delete_pool(body: kopf.Body, retry: int, **_: Any) -> None:
    await _finalize("SandboxPool", pools().cleanup(body))


# kopf (1.45) logs these, from this logger, when reading discovery leaves a resource of a handler unserved;
# relied on by UnservedResourcesGuard, pinned by tests/e2e/test_operator_apiserver_restart.py.
KOPF_OBSERVATION_LOGGER = "kopf._core.reactor.observation"
KOPF_UNSERVED = ("Unresolved resources cannot be served", "Non-watchable resources will not be served",
                 "Non-patchable resources will not be served")
_unserved: str | None = None  # why the operator stopped on its own, once it has
UNSERVED_STOP = "kopf does not serve this operator's resources"  # how that stop's log line begins


class UnservedResourcesGuard(logging.Handler):
    """Stops the operator when kopf's one read of discovery left Workflows or Sandboxes unserved.

    With scanning off kopf never reads discovery again, so such an operator would serve nothing for good: it
    is stopped instead (``dsb operator`` exits 1 saying why) and restarted by whoever runs it; its next start
    waits for discovery again (:func:`kube.discovery.wait_until_served`)."""

    def emit(self, record: logging.LogRecord) -> None:
        global _unserved
        message = record.getMessage()
        if _unserved is not None or not message.startswith(KOPF_UNSERVED) or GROUP not in message:
            return
        _unserved = (f"{UNSERVED_STOP}: the API server's discovery did not list them "
                     f"when kopf read it (an API server restarting just then?); restart the operator. kopf said: "
                     f"{message}")
        log.error("%s; stopping", _unserved)
        if _stop_flag is not None:
            asyncio.get_running_loop().create_task(_graceful_stop(_stop_flag))


GRACEFUL_STOP_INSTALL_DELAY = 0.5  # seconds after startup: kopf's own signal handlers are in place by then
_stop_flag: asyncio.Event | None = None
_stopping: asyncio.Task[None] | None = None


def _install_graceful_stop() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _begin_stop, sig)


def _begin_stop(sig: signal.Signals) -> None:
    """SIGTERM (a rolling update) or SIGINT: hand every run executing here over at a call boundary, then stop
    kopf. Runs are tasks of the operator, not kopf daemons, so kopf would cancel them within seconds; a second
    signal stops at once."""
    global _stopping
    if _stop_flag is None:
        return
    if _stopping is not None:
        _stop_flag.set()
        return
    log.info("%s: handing this replica's runs over, then stopping", sig.name)
    READINESS.not_ready("stopping: handing runs over to other replicas")
    _stopping = asyncio.get_running_loop().create_task(_graceful_stop(_stop_flag))


async def _graceful_stop(flag: asyncio.Event) -> None:
    try:
        if _operator is not None:
            await _operator.shutdown()
    finally:
        flag.set()


def run(*, namespaces: list[str], liveness: str | None) -> str | None:
    """Run the operator until SIGINT/SIGTERM (runs are handed over to other replicas, then kopf stops). Returns
    None then, or why it stopped on its own (kopf does not serve its resources: see UnservedResourcesGuard)."""
    global _stop_flag
    config.namespaces = list(namespaces)
    _stop_flag = asyncio.Event()  # bound to kopf's loop on first use
    logging.getLogger(KOPF_OBSERVATION_LOGGER).addHandler(UnservedResourcesGuard(logging.WARNING))
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
        stop_flag=_stop_flag,
    )
    return _unserved
