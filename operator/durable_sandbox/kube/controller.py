"""The operator's reconcile logic, without kopf: one Workflow = one run, driven while there is work and
parked while it waits.

kopf (``kube/handlers.py``) calls three things here: :meth:`Operator.notice` for every watch event of a
Workflow (the initial listing included), :meth:`Operator.forget` when one is gone, and
:meth:`Operator.cleanup` from the delete handler (behind the ``durable-sandbox.dev/cleanup`` finalizer).

**Active and parked runs.** A run is *active* while a task of this process drives it (admits it, claims its
Lease, executes it, writes its status). When the run has nothing to do for a while (it waits on a signal,
a durable timer, ``spec.suspend``, a retry backoff, a Sandbox, another replica's Lease, or it is finished)
the task ends and the run is *parked*: a small record (names, generation, why) and at most one timer
handle, no task, no journal, no status writer, no sandbox (a waiting run's sandbox is hibernated). A
parked run becomes active again on the watch event that can change its course (a new ``generation``:
``signals``, ``suspend``, ``cancel``; for a run another replica executes, also its status ``phase``, which
that replica writes when it hands the run over or finishes it) or when its timer fires (``wakeAt``, the
hibernation point, the TTL after finishing, the end of another replica's Lease), never by a per-run poll.
That is what keeps a thousand Workflows waiting on approvals at a few KiB each (docs/benchmarks.md).

**Replicas share the work.** kopf runs in standalone peering on every replica, so every replica sees every
Workflow; the run's Lease decides who executes it. Claims are spread by delay: a replica waits before
claiming in proportion to the runs it executes already (with jitter), so the less busy replica wins the
race for new runs and a batch splits between replicas without any membership protocol (docs/operations.md
says why this and not sharding by run id). A replica that loses the claim parks the run until the Lease
could have expired (or the holder's status says it handed the run over or finished it); a dead holder's
runs are taken over after about one lease period and replayed, fenced by the Lease's transitions. Only the
replica executing a run writes its status (a projection of the commits it makes, see ``kube/status.py``)
and its lifecycle Events.

Operator policy, checked before anything is imported or provisioned: the local provider only with
``allow_local_provider``; entrypoints only from the configured workflow modules (``sandbox-agent``
always); provider credentials from Secrets named by ``sandbox.env[].valueFrom.secretKeyRef``, read
per run in the Workflow's namespace, handed to the sandbox and never journaled or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kubernetes.aio.client import models as k8s_models
from pydantic import ValidationError

import durable_sandbox
from durable_sandbox.engine import LeaseHeld, NotRunnableHere, RunStatus, SignalConflict
from durable_sandbox.engine.errors import StoreUnavailable
from durable_sandbox.engine.executor import default_worker_id
from durable_sandbox.engine.records import Commit, OperationRecord, OpKind, RunRecord
from durable_sandbox.kube import holding
from durable_sandbox.kube.client import KubeClient, is_not_found, is_transient
from durable_sandbox.kube.concurrency import (
    CONCURRENCY_LIMIT_REASON,
    DEFAULT_MAX_CONCURRENT_RUNS,
    RunSlots,
    concurrency_limit_condition,
)
from durable_sandbox.kube.events import (
    TERMINAL_REASONS,
    EventRecorder,
    LifecycleEvent,
    lifecycle_events,
    run_status_event,
    terminal_event,
)
from durable_sandbox.kube.manifests import format_loc
from durable_sandbox.kube.metrics import METRICS
from durable_sandbox.kube.models import GROUP, VERSION, SandboxResource, WorkflowResource
from durable_sandbox.kube.objects import ObjectView
from durable_sandbox.kube.plan import PlanError, RunPlan, WorkflowUnavailable, cluster_run_id, plan_workflow
from durable_sandbox.kube.secrets import read_secret_values, secret_refs
from durable_sandbox.kube.status import TERMINAL_PHASES, Extra, Projection, StatusWriter, render
from durable_sandbox.kube.store import KubernetesStore, OwnerRef
from durable_sandbox.providers.contract import INSTALLATION_LABEL
from durable_sandbox.workflows import sandbox_agent

log = logging.getLogger("durable_sandbox.kube.controller")
TRANSIENT_BACKOFF_MAX = 8.0  # seconds between tries while the API server is unreachable
TRANSIENT_WAKE_SPREAD = 4.0  # a run that woke while it was unreachable looks again after 1-4 x claim_retry

FINALIZER = "durable-sandbox.dev/cleanup"
WORKFLOWS = "workflows"
SANDBOXES = "sandboxes"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class OperatorPolicy:
    """What this operator may do on behalf of the Workflows it serves."""

    allow_local_provider: bool = False
    # Modules (or packages) entrypoints may be imported from; the built-in sandbox-agent is always allowed.
    workflow_modules: tuple[str, ...] = ()


@dataclass
class OperatorSettings:
    worker_id: str = field(default_factory=default_worker_id)
    lease_ttl: float = 15.0  # a dead replica's runs are taken over after this long
    claim_retry: float = 1.0  # the least (and the jitter of) how long a run another replica holds is parked
    status_interval: float = 1.0  # status patches are coalesced to about one per this many seconds
    # Writes that follow the clock, not the work: status patches and run-event batches of all the Workflows
    # this process drives, each kind at most about this many per second together (beside phase changes,
    # which are written at once). Each Workflow's interval is stretched beyond status_interval (events: 1 s)
    # when more run at once: 20 Workflows get one status patch every 4 s each, not 20 patches a second.
    periodic_writes_per_s: float = 5.0
    handover_grace: float = 20.0  # how long a call in flight may take to finish when a run is handed over
    not_runnable_retry: float = 30.0
    hibernate_after: float = 300.0  # default for runs whose spec says nothing (DESIGN 6)
    cleanup_backoff: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
    # A wait longer than this parks the run (its task ends; a timer or the watch brings it back); shorter
    # waits are cheaper in the task than a re-admission (which reads the run's head and journal again).
    park_after: float = 2.0
    # Claim spreading: before claiming, a replica waits this long per run it executes already (times a
    # random factor in [0.5, 1.5), at most claim_delay_max), so the less busy replica claims new runs first.
    claim_delay_per_run: float = 0.1
    claim_delay_max: float = 1.5
    shutdown_grace: float = 60.0  # how long SIGTERM waits for active runs to be handed over
    # Runs admitted at once: an operator restart re-admits every Workflow, and each admission reads the run's
    # head and journal; a few at a time keep that burst's memory small (the RSS it leaves is its high-water mark).
    admissions: int = 8
    max_concurrent_runs: int = DEFAULT_MAX_CONCURRENT_RUNS  # runs this replica executes at once (kube/concurrency.py)
    # Every sandbox (and snapshot) this operator makes is labelled with it; the orphan sweep lists by it.
    installation_id: str = "durable-sandbox"
    sweep_interval: float = 300.0  # seconds between orphan sweeps (kube/sweeper.py); 0: no sweep
    sweep_grace: float = 600.0  # an orphan is removed once seen orphaned this long


def give_back_memory() -> None:
    """No run is active any more: hand the memory the last burst of activity used back to the OS. Without
    this a replica's RSS stays at the high-water mark of its busiest moment (the C allocator keeps freed
    heap), however few runs it holds now. A full collection takes milliseconds and happens only when the
    replica has just gone idle; ``malloc_trim(0)`` where the C library has it (glibc)."""
    global _malloc_trim
    gc.collect()
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


class Park(Exception):
    """Raised inside a run's task: the run has nothing to do for ``delay`` seconds (None: until a watch event)."""

    def __init__(self, delay: float | None, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


@dataclass(slots=True)
class Parked:
    """All this process keeps of a parked run: enough to find it again and to judge which events wake it."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    # waiting, suspended, finished, held (another replica's Lease), not-runnable, rejected, backoff, error,
    # api-unreachable
    reason: str
    phase: str | None  # status.phase when parked: a held run wakes when the executing replica changes it
    sandbox: str | None = None  # the Sandbox (spec.sandboxRef) the run waits for
    timer: asyncio.TimerHandle | None = None


class CleanupPending(Exception):
    """Cleanup cannot finish yet (the provider refuses, or another replica executes the run); retry later."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


@dataclass(kw_only=True)
class RunView(ObjectView):
    """What this process knows of one Workflow's run: the projection it writes as status."""

    run_id: str
    projection: Projection = field(default_factory=Projection)
    extra: Extra = field(default_factory=Extra)
    run: RunRecord | None = None
    writer: StatusWriter | None = None
    phase: str | None = None
    signals_sent: dict[str, Any] = field(default_factory=dict)
    cancel_sent: bool = False
    executing: bool = False  # this process holds the lease and writes status/events
    waiting_for: str | None = None  # the Sandbox (spec.sandboxRef) the run waits for
    released: bool = False  # the Sandbox this run held has been let go


class ObservedStore:
    """The store as the executor sees it, with every successful commit and run update reported, so
    status and Events are projections of what is written: nothing is read back for them."""

    def __init__(self, inner: Any, on_write: Callable[[str, Commit | None, dict[str, Any] | None], None],
                 event_interval: Callable[[], float] | None = None,
                 on_read: Callable[[str, list[OperationRecord]], None] | None = None) -> None:
        self._inner = inner
        self._on_write = on_write
        self._event_interval = event_interval
        self._on_read = on_read

    @property
    def event_interval(self) -> float:
        """How long a run's events wait to be written in a batch (``RunRuntime`` reads it)."""
        if self._event_interval is not None:
            return self._event_interval()
        return float(getattr(self._inner, "event_interval", 0.0))

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        await self._inner.commit(run_id, fence, commit)
        self._on_write(run_id, commit, commit.run)

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        await self._inner.update_run(run_id, changes, fence=fence)
        self._on_write(run_id, None, changes)

    # Journal reads are reported too: rows another replica committed (the executor reads the journal when it
    # claims a run, and when it finds the run finished) reach the status projection before this process
    # writes status from it.

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return self._reported(run_id, await self._inner.load_journal(run_id))

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        return self._reported(run_id, await self._inner.journal_since(run_id, after_seq))

    def _reported(self, run_id: str, rows: list[OperationRecord]) -> list[OperationRecord]:
        if self._on_read is not None:
            self._on_read(run_id, rows)
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Operator:
    def __init__(
        self,
        api: KubeClient,
        *,
        policy: OperatorPolicy | None = None,
        settings: OperatorSettings | None = None,
        providers: Any = None,
        journal_key: bytes | None = None,
    ) -> None:
        self.api = api
        self._journal_key = journal_key  # seals every journal value this operator writes (kube/sealing.py)
        self.policy = policy or OperatorPolicy()
        self.settings = settings or OperatorSettings()
        self.events = EventRecorder(api.core, instance=self.settings.worker_id)
        self._providers = providers
        self._engines: dict[str, durable_sandbox.Engine] = {}
        self._views: dict[str, RunView] = {}  # run id -> view
        self._secrets: dict[str, dict[tuple[str, str], str]] = {}  # run id -> secret values it may use
        self._env_values: dict[str, dict[str, str]] = {}  # run id -> the spec's literal env values
        self._background: set[asyncio.Task[Any]] = set()
        self._active: dict[str, asyncio.Task[None]] = {}  # run id -> the task driving it here
        self._parked: dict[str, Parked] = {}  # run id -> parked run
        self._stopped = asyncio.Event()  # set when the replica stops (SIGTERM): runs are handed over
        self._admitting = asyncio.Semaphore(self.settings.admissions)
        self.slots = RunSlots(self.settings.max_concurrent_runs)
        self.stopping = False
        METRICS.runs.labels(state="active").set_function(lambda: len(self._active))
        METRICS.runs.labels(state="parked").set_function(lambda: len(self._parked))

    # ------------------------------------------------------------------ clock-driven writes, on a budget

    def _periodic_interval(self, floor: float) -> float:
        return max(floor, len(self._views) / self.settings.periodic_writes_per_s)

    def _status_interval(self) -> float:
        return self._periodic_interval(self.settings.status_interval)

    def _event_interval(self) -> float:
        return self._periodic_interval(KubernetesStore.event_interval)

    # ------------------------------------------------------------------ engines (one store per namespace)

    def engine_for(self, namespace: str) -> durable_sandbox.Engine:
        engine = self._engines.get(namespace)
        if engine is None:
            store = ObservedStore(KubernetesStore(namespace, self.api, journal_key=self._journal_key), self._observed,
                                  self._event_interval,
                                  self._read)
            engine = durable_sandbox.Engine(
                store,
                worker_id=self.settings.worker_id,
                lease_ttl=self.settings.lease_ttl,
                providers=self._provider,
                hibernate_after=self.settings.hibernate_after,
                unresolvable="leave",
                services={"secrets": self._secrets_for, "owner": self._owner_for, "env_values": self._env_values_for,
                          "attached_sandbox": self._attached_sandbox, "sandbox_labels": self.sandbox_labels},
            )
            self._engines[namespace] = engine
        return engine

    @property
    def sandbox_labels(self) -> dict[str, str]:
        """Labels of every sandbox this operator provisions (Workflows' and Sandbox resources')."""
        return {INSTALLATION_LABEL: self.settings.installation_id}

    def _provider(self, name: str) -> Any:
        if name == "local" and not self.policy.allow_local_provider:
            from durable_sandbox.providers.contract import ConfigurationError

            raise ConfigurationError(
                "The local provider is not allowed by this operator (it is no isolation boundary); start the "
                "operator with --allow-local-provider for development, or use another provider."
            )
        if self._providers is None:
            from durable_sandbox.providers.registry import create_provider

            return create_provider(name)
        return self._providers(name) if callable(self._providers) else self._providers[name]

    def provider_for(self, name: str) -> Any:
        """Provider ``name`` under this operator's policy (the local provider only when allowed); Sandbox
        resources get theirs here too."""
        return self._provider(name)

    def _secrets_for(self, run_id: str) -> dict[tuple[str, str], str]:
        return self._secrets.get(run_id, {})

    def _env_values_for(self, run_id: str) -> dict[str, str] | None:
        # Literal env values are kept out of the stored input (they may be secrets): the Workflow object
        # has them, and every daemon re-plans its object before it drives the run.
        return self._env_values.get(run_id)

    def _owner_for(self, run_id: str) -> str | None:
        view = self._views.get(run_id)
        return view.owner if view is not None else None

    # ------------------------------------------------------------------ projection of what the executor writes

    def _observed(self, run_id: str, commit: Commit | None, changes: dict[str, Any] | None) -> None:
        view = self._views.get(run_id)
        if view is None:
            return
        if commit is not None and commit.records:
            view.projection.feed(commit.records)
            for event in lifecycle_events(commit.records):
                self._emit(view, event)
        if changes and view.run is not None:
            known = {k: v for k, v in changes.items() if hasattr(view.run, k)}
            view.run = replace(view.run, **known)
        self._offer(view)

    def _read(self, run_id: str, rows: list[OperationRecord]) -> None:
        view = self._views.get(run_id)
        if view is not None:
            view.projection.catch_up(rows)

    def _republish(self, view: RunView) -> None:
        """Write the status anew when this daemon starts and the object's status disagrees with the run: the
        process that last changed the run may have died (or lost the API server) before its status patch
        landed, and a run waiting for a signal that says Running would never get one."""
        shown = view.body.get("status") or {}
        status = self.status_of(view)
        if any(shown.get(key) != status.get(key) for key in ("phase", "pendingCallbacks")):
            self._offer(view)

    def _offer(self, view: RunView) -> None:
        if view.writer is None:
            return
        status = self.status_of(view)
        phase = status.get("phase")
        if phase != view.phase:
            event = run_status_event(phase or "", self._phase_message(view, phase or ""))
            if event is not None and event.reason in TERMINAL_REASONS and view.run is not None:
                # Every replica that writes this status (the executing one; one re-activating the finished run
                # that saw its status stale) may get here: the Event's fixed name keeps it to one.
                event = terminal_event(event, workflow=view.name, uid=view.uid, epoch=view.run.epoch)
            if event is not None:
                self._emit(view, event)
            view.phase = phase
        view.writer.offer(status)

    def status_of(self, view: RunView) -> dict[str, Any]:
        previous = (view.body.get("status") or {}).get("conditions") or []
        status = render(view.run, view.projection, view.extra, run_id=view.run_id, previous_conditions=previous)
        engine = self._engines.get(view.namespace)
        if engine is not None:
            store = engine.store
            names = store.journal_objects(view.run_id) if hasattr(store, "journal_objects") else []
            status["journal"] = [{"name": n} for n in names]
        return status

    @staticmethod
    def _phase_message(view: RunView, phase: str) -> str:
        run = view.run
        if phase == "Waiting" and run is not None:
            pending = ", ".join(run.pending_callbacks)
            return f"waiting for signal(s) {pending}; set spec.signals to continue" if pending else "waiting for a timer"
        if phase in ("Failed", "Cancelled") and run is not None and run.error is not None:
            return f"{run.error.type}: {run.error.message}"[:1024]
        if phase == "Succeeded":
            calls = view.projection.calls()
            return f"run {view.run_id} succeeded ({calls['completed']}/{calls['total']} calls)"
        return f"run {view.run_id} is {phase.lower()}"

    def _emit(self, view: RunView, event: LifecycleEvent) -> None:
        task = asyncio.get_running_loop().create_task(self.events.emit(dict(view.body), event))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _patch_status(self, view: RunView, status: dict[str, Any]) -> None:
        try:
            await self.api.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, view.namespace, WORKFLOWS, view.name, {"status": status},
                field_manager="durable-sandbox-operator", _content_type=MERGE_PATCH,
            )
        except Exception as exc:
            if is_not_found(exc):
                return  # the Workflow is gone
            raise

    # ------------------------------------------------------------------ the daemon

    def notice(self, body: Mapping[str, Any]) -> None:
        """The watch saw ``body`` (or kopf listed it): bring it to its run. An active run is woken if the spec
        changed (status updates do not count); a parked one is made active again if the event can change
        its course; one never seen is admitted."""
        meta = body.get("metadata", {})
        uid, name = meta.get("uid", ""), meta.get("name", "")
        if not uid or not name:
            return
        run_id = cluster_run_id(name, uid)
        view = self._views.get(run_id)
        if view is not None:
            view.notice(body)
            return
        if self.stopping or run_id in self._active:
            return  # starting up (the task reads the object itself) or stopping
        if meta.get("deletionTimestamp"):
            # Being deleted: the delete handler finalizes the run (kube/handlers.py); nothing to drive.
            self._unpark(run_id)
            return
        parked = self._parked.get(run_id)
        if parked is not None and meta.get("generation") == parked.generation:
            phase = (body.get("status") or {}).get("phase")
            if parked.reason != "held" or phase == parked.phase:
                return
        self._activate(run_id, body, meta.get("namespace", ""), name, uid)

    def forget(self, body: Mapping[str, Any]) -> None:
        """The Workflow is gone (its finalizer was removed): drop what is kept of its run."""
        meta = body.get("metadata", {})
        if meta.get("uid") and meta.get("name"):
            self._unpark(cluster_run_id(meta["name"], meta["uid"]))

    def _unpark(self, run_id: str) -> Parked | None:
        parked = self._parked.pop(run_id, None)
        if parked is not None and parked.timer is not None:
            parked.timer.cancel()
        return parked

    def _activate(self, run_id: str, body: Mapping[str, Any] | None, namespace: str, name: str, uid: str) -> None:
        self._unpark(run_id)
        task = asyncio.get_running_loop().create_task(self._run_task(run_id, body, namespace, name, uid),
                                                      name=f"run {run_id}")
        self._active[run_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._active.get(run_id) is t:
                del self._active[run_id]
            if not self._active and not self.stopping:
                give_back_memory()
            if not t.cancelled() and t.exception() is not None:
                METRICS.reconcile_errors.labels(kind="Workflow").inc()
                log.error("run %s: %s", run_id, t.exception(), exc_info=t.exception())
                if not self.stopping:  # try again later, as kopf retried a failed daemon
                    self._park(Parked(namespace, name, uid, None, "error", None), self.settings.not_runnable_retry)

        task.add_done_callback(done)

    def _park(self, parked: Parked, delay: float | None) -> None:
        run_id = cluster_run_id(parked.name, parked.uid)
        if self.stopping:
            return
        self._unpark(run_id)
        if delay is not None:
            parked.timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._due, run_id)
        self._parked[run_id] = parked

    def _due(self, run_id: str) -> None:
        """A parked run's timer fired: activate it (its task reads the object afresh)."""
        parked = self._parked.get(run_id)
        if parked is not None and not self.stopping:
            parked.timer = None
            self._activate(run_id, None, parked.namespace, parked.name, parked.uid)

    async def _run_task(self, run_id: str, body: Mapping[str, Any] | None, namespace: str, name: str, uid: str) -> None:
        """Drive the run of one Workflow until it has nothing to do, then park it."""
        if body is None:
            try:
                body = await self._workflow(namespace, name)
            except Exception as exc:
                if not is_transient(exc) or self.stopping:
                    raise
                # A parked run woke (its timer) while the API server is away, e.g. restarting: not the run's
                # fault, so no error and no not_runnable_retry wait; look again in a few seconds, spread so
                # that the timers of a whole backlog do not all hit a recovering API server at once.
                delay = self.settings.claim_retry * random.uniform(1.0, TRANSIENT_WAKE_SPREAD)
                log.warning("%s/%s: the API server could not be reached (%s: %s); trying again in %.1fs",
                            namespace, name, type(exc).__name__, exc, delay)
                self._park(Parked(namespace, name, uid, None, "api-unreachable", None), delay)
                return
            if body is None or body.get("metadata", {}).get("uid") != uid or body["metadata"].get("deletionTimestamp"):
                return  # gone, replaced, or being deleted (the delete handler finalizes it)
        view = RunView(namespace=namespace, name=name, uid=uid, run_id=run_id, body=body)
        self._views[run_id] = view

        async def patch(status: dict[str, Any]) -> None:
            await self._patch_status(view, status)

        view.writer = StatusWriter(patch, interval=self._status_interval)
        park: Park | None = None
        try:
            park = await self._serve(view, self._stopped)
        finally:
            with contextlib.suppress(Exception):
                await view.writer.aclose()
            self._views.pop(run_id, None)
            self._secrets.pop(run_id, None)
            self._env_values.pop(run_id, None)
            engine = self._engines.get(namespace)
            if (engine is not None and hasattr(engine.store, "forget") and not view.deleting
                    and not engine.executor.is_executing(run_id)):
                engine.store.forget(run_id)  # its head's bookkeeping; read again when the run is next active
        if park is None or self.stopping:
            return
        if view.wake.is_set() and not view.deleting:
            # The spec changed while the task was finishing: look at it now rather than park.
            self._activate(run_id, view.body, namespace, name, uid)
            return
        self._park(Parked(namespace, name, uid, view.generation, park.reason, (view.body.get("status") or {}).get("phase"),
                          sandbox=view.waiting_for), park.delay)

    async def _workflow(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = await self.api.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, WORKFLOWS, name)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return obj if isinstance(obj, dict) else None

    async def _serve(self, view: RunView, stopped: asyncio.Event) -> Park | None:
        """Turn after turn until the run is parked (returned), finished for good or this replica stops (None)."""
        engine = self.engine_for(view.namespace)
        plan: RunPlan | None = None
        failures = 0  # consecutive turns the API server could not be reached
        while not stopped.is_set() and not self.stopping and not view.deleting:
            view.latest()
            view.generation = view.body.get("metadata", {}).get("generation")
            view.wake.clear()
            view.extra.generation = self._acted_generation(view)
            try:
                if plan is None:
                    async with self._admitting:
                        plan = await self._admit(view)
                    if plan is None:
                        if view.extra.rejected is not None:  # final until the spec changes
                            return Park(None, "rejected")
                        await self._wait(view, stopped, self.settings.not_runnable_retry, "not-runnable")
                        continue
                    view.extra.max_attempts = plan.max_attempts
                    self._republish(view)
                outcome = await self._step(view, engine, plan, stopped)
            except Park as park:
                return park
            except Exception as exc:
                if not (is_transient(exc) or isinstance(exc, StoreUnavailable)):
                    raise
                # The API server is away (a restart, an overload): the run is not at fault and the daemon
                # must not crash (kopf would wait a minute before restarting it); look again shortly.
                failures += 1
                delay = min(self.settings.claim_retry * 2 ** (failures - 1), TRANSIENT_BACKOFF_MAX)
                log.warning("%s/%s: the API server could not be reached (%s: %s); trying again in %.1fs",
                            view.namespace, view.name, type(exc).__name__, exc, delay)
                await self._wait(view, stopped, delay, "api-unreachable")
                continue
            failures = 0
            if outcome == "done":
                return None
        return None

    @staticmethod
    def _acted_generation(view: RunView) -> int | None:
        """The generation this replica may write as status.observedGeneration at the start of a turn: the
        spec's, except while a ``spec.suspend`` waits for the run's lease (the replica executing the run
        acts on it, and says so itself; ``_step`` moves it here once the run is suspended). Otherwise a
        replica that merely saw the suspend would tell the world it had taken effect."""
        spec, shown = view.body.get("spec") or {}, view.body.get("status") or {}
        settled = shown.get("phase") == "Suspended" or shown.get("phase") in TERMINAL_PHASES  # nothing left to stop
        if spec.get("suspend") and not settled and not view.extra.suspended:
            held = shown.get("observedGeneration")
            return held if isinstance(held, int) else None
        return view.generation

    async def _admit(self, view: RunView) -> RunPlan | None:
        """Policy and plan: returns the plan, or None after recording why the run cannot start
        (a rejection is final and written as Failed; a missing Secret or workflow code is retried)."""
        try:
            wf = WorkflowResource.model_validate(dict(view.body))
        except ValidationError as exc:
            err = exc.errors()[0]
            ctx = err.get("ctx") or {}
            reason = "UnknownProvider" if err.get("type") == "unknown_provider" else "InvalidSpec"
            loc = format_loc([*err.get("loc", ()), *ctx.get("subloc", [])])
            await self._reject(view, reason, f"{loc}: {err.get('msg')}")
            return None
        provider = (wf.spec.sandbox.provider if wf.spec.sandbox is not None else None)
        sandboxes: dict[str, SandboxResource] = {}
        if wf.spec.sandbox_ref is not None:
            found = await self._sandbox(view.namespace, wf.spec.sandbox_ref.name)
            if found is not None:
                sandboxes[found.metadata.name] = found
                provider = found.spec.provider
        if wf.spec.tool_calls is not None and provider is None:
            provider = "local"  # sandbox-agent's default
        if provider == "local" and not self.policy.allow_local_provider:
            await self._reject(
                view, "ProviderNotAllowed",
                "spec.sandbox.provider: the local provider is not allowed by this operator (it is no isolation "
                "boundary); start the operator with --allow-local-provider for development, or use another provider",
            )
            return None
        try:
            plan = plan_workflow(
                wf, source=f"{view.namespace}", sandboxes=sandboxes, cluster=True,
                allowed_modules=[*self.policy.workflow_modules, sandbox_agent.__name__],
            )
        except WorkflowUnavailable as exc:
            view.extra.not_runnable = str(exc)
            self._offer(view)
            return None
        except PlanError as exc:
            await self._reject(view, exc.reason, str(exc))
            return None
        try:
            self._secrets[view.run_id] = await self._read_secrets(view.namespace, plan)
        except LookupError as exc:
            view.extra.not_runnable = str(exc)
            self._offer(view)
            return None
        if wf.spec.sandbox_ref is not None:
            waits = await holding.hold(self.api, view.namespace, wf.spec.sandbox_ref.name, view.name)
            if waits is not None:
                view.waiting_for = wf.spec.sandbox_ref.name
                view.extra.not_runnable, view.extra.not_runnable_reason = waits, "WaitingForSandbox"
                self._offer(view)
                return None
        view.waiting_for = None
        view.extra.not_runnable, view.extra.not_runnable_reason = None, None
        self._env_values[view.run_id] = dict(plan.env_values)
        engine = self.engine_for(view.namespace)
        record = engine.client.record(plan.definition, plan.input, run_id=plan.run_id, labels=plan.labels)
        store: Any = engine.store  # a KubernetesStore: the run's objects are owned by the Workflow
        run, _ = await store.create_run(record, owner=OwnerRef(name=view.name, uid=view.uid))
        view.run = run
        view.projection = Projection(total_calls=_total_calls(plan))
        view.projection.feed(await store.load_journal(view.run_id))
        return plan

    async def _reject(self, view: RunView, reason: str, message: str) -> None:
        view.extra.rejected = (reason, message)
        self._emit(view, LifecycleEvent(reason, message[:1024], "Warning"))
        assert view.writer is not None
        view.writer.offer(self.status_of(view))
        await view.writer.flush()

    async def _attached_sandbox(self, run_id: str, name: str) -> Any:
        view = self._views.get(run_id)
        if view is None:
            raise RuntimeError(f"run {run_id} is not served by this operator")
        return await holding.live_handle(self.api, view.namespace, name)

    def sandbox_changed(self, namespace: str, name: str) -> None:
        """A Sandbox changed: wake the runs waiting for it (it may be Ready, or let go by its holder)."""
        for view in self._views.values():
            if view.namespace == namespace and view.waiting_for == name:
                view.wake.set()
        for run_id, parked in list(self._parked.items()):
            if parked.namespace == namespace and parked.sandbox == name:
                self._activate(run_id, None, parked.namespace, parked.name, parked.uid)

    async def _let_go(self, view: RunView) -> None:
        """A finished (or deleted) Workflow lets go of the Sandbox it held through spec.sandboxRef."""
        if view.released:
            return
        ref = ((view.latest().get("spec") or {}).get("sandboxRef") or {}).get("name")
        if ref:
            await holding.release(self.api, view.namespace, ref, view.name)
        view.released = True

    async def _sandbox(self, namespace: str, name: str) -> SandboxResource | None:
        try:
            obj = await self.api.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SANDBOXES, name)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return SandboxResource.model_validate(obj)

    async def _read_secrets(self, namespace: str, plan: RunPlan) -> dict[tuple[str, str], str]:
        """The Secret values the run's sandbox env references (values never leave this process's memory
        except into the sandbox)."""
        sandbox = plan.input.get("sandbox") if isinstance(plan.input, dict) else None
        refs = secret_refs((sandbox or {}).get("env") or [])
        return await read_secret_values(self.api.core, namespace, refs, where="spec.sandbox.env")

    async def _sync_spec(self, view: RunView, engine: durable_sandbox.Engine) -> WorkflowResource | None:
        """Bring spec.signals and spec.cancel to the run (idempotent: a signal is stored once)."""
        try:
            wf = WorkflowResource.model_validate(dict(view.body))
        except ValidationError:
            return None
        for callback_id, value in wf.spec.signals.items():
            if view.signals_sent.get(callback_id, _MISSING) == value:
                continue
            try:
                await engine.client.signal(view.run_id, callback_id, value)
            except SignalConflict as exc:
                self._emit(view, LifecycleEvent("SignalConflict", str(exc)[:1024], "Warning"))
            view.signals_sent[callback_id] = value
        if wf.spec.cancel and not view.cancel_sent:
            await engine.client.request_cancel(view.run_id, "spec.cancel is true")
            view.cancel_sent = True
        return wf

    async def _step(self, view: RunView, engine: durable_sandbox.Engine, plan: RunPlan, stopped: asyncio.Event) -> str:
        """One turn of the daemon: bring the spec to the run, then drive, wait or finish."""
        wf = await self._sync_spec(view, engine)
        suspend = bool(wf and wf.spec.suspend)
        run = await engine.store.get_run(view.run_id)
        if run is None:  # the run's objects are gone (deleted with the Workflow): nothing to drive
            return "done"
        view.run = run
        view.extra.attempt = run.epoch + 1
        deadline = run.created_at + plan.timeout if plan.timeout is not None else None
        if deadline is not None and not run.status.terminal and time.time() >= deadline and not run.cancel_requested:
            await engine.client.request_cancel(view.run_id, f"timed out after {plan.timeout:g}s (spec.timeoutSeconds)")
            return "again"
        if run.status.terminal:
            if run.status == RunStatus.FAILED and not run.cancel_requested and run.epoch + 1 < plan.max_attempts:
                assert plan.retry is not None
                delay = plan.retry.interval(run.epoch + 2)
                retry_at = run.updated_at + delay
                if time.time() < retry_at:
                    await self._wait(view, stopped, retry_at - time.time(), "backoff")
                    return "again"
                return await self._drive(view, engine, plan, stopped, deadline)
            return await self._finished(view, plan, stopped)
        if run.cancel_requested:
            return await self._drive(view, engine, plan, stopped, deadline)
        if suspend:
            if run.status != RunStatus.SUSPENDED and not await self._suspend(view, engine):
                # Its lease is held: by a replica executing it (which stops at the next boundary), or by one
                # that died or was cut off from the API server (the lease expires). Look again shortly: waiting
                # for the next watch event could mean waiting forever.
                await self._wait(view, stopped, self.settings.claim_retry, "suspend-lease-held")
                return "again"
            view.extra.generation = view.generation  # suspended: the change has taken effect
            await self._wait(view, stopped, None, "suspended")
            return "again"
        view.extra.suspended = False
        if run.status == RunStatus.SUSPENDED:
            await engine.store.update_run(view.run_id, {"status": RunStatus.PENDING})
            self._emit(view, LifecycleEvent("Resumed", "spec.suspend is false; resuming the run"))
            return "again"
        if run.status == RunStatus.WAITING:
            now = time.time()
            due = [t for t in (run.wake_at, deadline) if t is not None]
            if run.wake_at is not None and run.wake_at <= now:
                return await self._drive(view, engine, plan, stopped, deadline)
            hibernate_at = run.updated_at + self._hibernate_after(plan)
            if hibernate_at <= now:
                with contextlib.suppress(LeaseHeld):
                    await engine.executor.hibernate(view.run_id)
            else:
                due.append(hibernate_at)
            await self._wait(view, stopped, (min(due) - now) if due else None, "waiting")
            return "again"
        return await self._drive(view, engine, plan, stopped, deadline)

    def _hibernate_after(self, plan: RunPlan) -> float:
        value = plan.input.get("hibernateAfterSeconds") if isinstance(plan.input, dict) else None
        return float(value) if value is not None else self.settings.hibernate_after

    async def _drive(
        self, view: RunView, engine: durable_sandbox.Engine, plan: RunPlan, stopped: asyncio.Event, deadline: float | None
    ) -> str:
        """Execute the run here if its lease is free; meanwhile keep the spec flowing to it."""
        executor = engine.executor
        delay = self._claim_delay()
        if delay > 0:
            await self._wait(view, stopped, delay, "claim")
            if view.wake.is_set() or stopped.is_set() or self.stopping or view.deleting:
                return "again"
        view.executing = True
        slot = asyncio.Event()  # set once the run holds one of this replica's execution slots

        async def drive_in_slot() -> Any:
            # The slot is taken before the Lease is claimed, so a run queued here stays free for a
            # replica with room (kube/concurrency.py).
            async with self.slots.slot(view.run_id, on_wait=lambda: self._queued(view)):
                slot.set()
                self._dequeued(view)
                fresh = await self._fresh_spec(view)
                if fresh != "unchanged":
                    return fresh  # the daemon's next turn acts on the newer spec (suspend, cancel, deletion)
                return await executor.drive(view.run_id, plan.definition, if_busy="skip")

        task = asyncio.create_task(drive_in_slot())
        handed_over = False
        given_up_at: float | None = None  # deleted: when the cleanup in this task is cut short
        try:
            while not task.done():
                waiters = [task, asyncio.ensure_future(view.wake.wait()), asyncio.ensure_future(stopped.wait())]
                timeout = max(0.0, deadline - time.time()) if deadline is not None else None
                if given_up_at is not None:
                    left = max(0.0, given_up_at - time.monotonic())
                    timeout = left if timeout is None else min(timeout, left)
                try:
                    await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters[1:]:
                        w.cancel()
                if task.done():
                    break
                if given_up_at is not None and time.monotonic() >= given_up_at:
                    # The provider still refuses the cleanup: the delete handler takes it over (with its
                    # backoff and the CleanupBlocked condition) once this task has stopped.
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    return "again"
                if not slot.is_set():
                    # Still queued for a slot: nothing executes, so a spec change, deletion, stop or
                    # deadline is judged afresh by the daemon's next turn (which queues again if needed).
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    self._dequeued(view)
                    view.executing = False
                    return "again"
                if view.deleting and not view.cancel_sent:
                    # Deleted mid-run: cancel now (cleanup runs here, at once) rather than hand the run over.
                    await engine.client.request_cancel(view.run_id, "the Workflow was deleted")
                    view.cancel_sent = True
                    given_up_at = time.monotonic() + self.settings.handover_grace
                    await executor.cancel_here(view.run_id, "the Workflow was deleted")
                    continue
                if stopped.is_set() or self.stopping:
                    if not handed_over:
                        executor.hand_over(view.run_id, "the operator replica is stopping")
                        handed_over = True
                        await self._finish_handover(task)
                    continue
                if deadline is not None and time.time() >= deadline:
                    await engine.client.request_cancel(view.run_id, f"timed out after {plan.timeout:g}s (spec.timeoutSeconds)")
                    await executor.cancel_here(view.run_id, "timeout")
                    continue
                if view.wake.is_set():
                    view.wake.clear()
                    generation = view.latest().get("metadata", {}).get("generation")
                    try:
                        wf = await self._sync_spec(view, engine)
                        run = await engine.store.get_run(view.run_id)
                    except Exception as exc:
                        if not (is_transient(exc) or isinstance(exc, StoreUnavailable)):
                            raise
                        # The API server is away: the run goes on here; bring the spec to it once it answers.
                        log.warning("%s/%s: the API server could not be reached (%s); the spec change is applied "
                                    "once it answers", view.namespace, view.name, type(exc).__name__)
                        await asyncio.wait([task], timeout=self.settings.claim_retry)
                        view.wake.set()
                        continue
                    # This generation is acted on by the replica executing the run: status.observedGeneration
                    # says so at once, so whoever changed the spec can tell that the run will stop (suspend) or
                    # has its signal from here on, not only after the run ends. Also stops status-only watch
                    # events from waking this loop again (they carry the same generation).
                    view.generation = view.extra.generation = generation
                    cancel = run.cancel_requested if run is not None and run.cancel_requested else None
                    if cancel is None and wf is not None and wf.spec.suspend and not handed_over:
                        executor.hand_over(view.run_id, "spec.suspend is true")
                        handed_over = True
                    self._offer(view)
                    if cancel is not None:
                        await executor.cancel_here(view.run_id, cancel)
            if task.cancelled():
                return "again"  # abandoned after the handover grace: the run was left pending
            try:
                if task.result() == "gone":
                    return "done"  # deleted (its finalizer is gone too) or replaced by a new object
            except LeaseHeld as held:
                # Another replica executes it. Park until its Lease could have expired (a dead holder's run
                # is then taken over) or until the holder's status phase changes (handed over, finished).
                view.executing = False
                jitter = random.uniform(0.0, self.settings.claim_retry)
                raise Park(min(max(held.remaining, self.settings.claim_retry), self.settings.lease_ttl) + jitter,
                           "held") from None
            except NotRunnableHere as exc:
                view.executing = False
                view.extra.not_runnable = str(exc)
                self._offer(view)
                await self._wait(view, stopped, self.settings.not_runnable_retry, "not-runnable")
            return "again"
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _fresh_spec(self, view: RunView) -> Literal["unchanged", "changed", "gone"]:
        """Read the Workflow afresh just before its run is claimed and executed here: is the spec still the
        one this turn judged? The watch may lag (after an API server restart it reconnects, and may re-list,
        seconds later): a replica taking over the run of one that died must not execute calls after a
        ``spec.suspend`` it has not seen yet, which the old holder had already acknowledged in
        status.observedGeneration. One GET per claim; a newer body wakes the daemon (``view.notice``)."""
        fresh = await self._workflow(view.namespace, view.name)
        if fresh is None or fresh.get("metadata", {}).get("uid") != view.uid:
            return "gone"
        meta = fresh.get("metadata", {})
        if meta.get("generation") == view.generation and not meta.get("deletionTimestamp"):
            return "unchanged"
        view.notice(fresh)
        return "changed"

    def _claim_delay(self) -> float:
        """How long to wait before claiming a run: longer the more runs this replica executes (or queues for
        an execution slot) already, so an idler replica wins the claim (with jitter, so two equally busy
        replicas do not claim in lockstep)."""
        busy = len(self.slots.executing) + len(self.slots.waiting)
        if busy == 0:
            return 0.0
        return min(self.settings.claim_delay_max, busy * self.settings.claim_delay_per_run * random.uniform(0.5, 1.5))

    def _queued(self, view: RunView) -> None:
        """The run waits for an execution slot: Pending, with Ready=False reason ConcurrencyLimit."""
        if view.run is not None and view.run.status == RunStatus.RUNNING:
            return  # another replica executes it (or did, until its lease runs out): its status stands
        cond = concurrency_limit_condition(self.slots.limit, len(self.slots.waiting))
        view.extra.not_runnable, view.extra.not_runnable_reason = cond["message"], cond["reason"]
        self._offer(view)

    def _dequeued(self, view: RunView) -> None:
        if view.extra.not_runnable_reason == CONCURRENCY_LIMIT_REASON:
            view.extra.not_runnable, view.extra.not_runnable_reason = None, None
            self._offer(view)

    async def _finish_handover(self, task: asyncio.Task[Any]) -> None:
        """Let the operation in flight finish (it is committed), then the run stops at the boundary; a
        call that outlasts the grace period is abandoned (it runs again, same operation id, elsewhere)."""
        done, _ = await asyncio.wait([task], timeout=self.settings.handover_grace)
        if not done:
            task.cancel()

    async def _suspend(self, view: RunView, engine: durable_sandbox.Engine) -> bool:
        """Pause a run between calls with no live sandbox: snapshot and destroy it (hibernate). False when its
        lease is held elsewhere."""
        executor = engine.executor
        try:
            lease = await engine.store.claim(view.run_id, executor.worker_id, executor.lease_ttl)
        except LeaseHeld:
            return False  # executing elsewhere: that replica sees spec.suspend through its own watch
        try:
            run = await engine.store.get_run(view.run_id)
            if run is None or run.status.terminal:
                return True
            hook = executor.services.get("hibernate_run")
            if hook is not None:
                await hook(executor, run, lease)
            view.extra.suspended = True
            await engine.store.update_run(view.run_id, {"status": RunStatus.SUSPENDED}, fence=lease.fence)
            return True
        finally:
            with contextlib.suppress(Exception):
                await engine.store.release(lease)

    async def _finished(self, view: RunView, plan: RunPlan, stopped: asyncio.Event) -> str:
        """A finished run: write its final status once, then honour ttlSecondsAfterFinished."""
        written = view.body.get("status") or {}
        rendered = self.status_of(view)
        if view.executing or (written.get("phase"), written.get("observedGeneration")) != (
                rendered.get("phase"), rendered.get("observedGeneration")):
            # The projection was made when this task admitted the run; another replica may have committed
            # the rest of it since (and finished it): fold those rows first (ObservedStore reports the read),
            # or the final status would show an older snapshot as the run's latest.
            await self.engine_for(view.namespace).store.journal_since(view.run_id, view.projection.last_seq)
            self._offer(view)  # not when every replica re-activating a finished Workflow would write it again
        await self._let_go(view)
        if plan.ttl_seconds_after_finished is None or view.run is None:
            await self._wait(view, stopped, None, "finished")
            return "again"
        due = view.run.updated_at + plan.ttl_seconds_after_finished
        if time.time() < due:
            await self._wait(view, stopped, due - time.time(), "finished")
            return "again"
        with contextlib.suppress(Exception):
            await self.api.custom.delete_namespaced_custom_object(
                GROUP, VERSION, view.namespace, WORKFLOWS, view.name,
                body=k8s_models.V1DeleteOptions(
                    preconditions=k8s_models.V1Preconditions(uid=view.uid), propagation_policy="Background"
                ),
            )
        return "done"

    async def _wait(self, view: RunView, stopped: asyncio.Event, timeout: float | None, why: str) -> None:
        """Wait for a watch event, the replica stopping, or ``timeout``; a longer wait than ``park_after``
        (or an open-ended one) parks the run instead: raises :class:`Park` and the run's task ends."""
        if not stopped.is_set() and not self.stopping and (timeout is None or timeout > self.settings.park_after):
            raise Park(timeout, why)
        await view.wait(stopped, timeout)

    # ------------------------------------------------------------------ deletion (behind the finalizer)

    async def cleanup(self, body: Mapping[str, Any], attempt: int = 0) -> None:
        """Cancel the run, finalize every sandbox and snapshot (from the journal), then return so the
        finalizer can go. Raises :class:`CleanupPending` while that cannot finish (retried with backoff)."""
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        run_id = cluster_run_id(name, uid)
        engine = self.engine_for(namespace)
        view = self._views.get(run_id) or RunView(namespace=namespace, name=name, uid=uid, run_id=run_id, body=body)
        delay = self.settings.cleanup_backoff[min(attempt, len(self.settings.cleanup_backoff) - 1)]
        run = await engine.store.get_run(run_id)
        if run is None:
            await self._cleanup_from_status(view, body, delay)
            await self._cleanup_done(view, body)
            return
        if not run.status.terminal:
            if not run.cancel_requested:
                await engine.client.request_cancel(run_id, "the Workflow was deleted")
            try:
                if not await engine.executor.cancel_here(run_id, "the Workflow was deleted"):
                    await engine.executor.drive_cancel(run_id)
            except LeaseHeld as exc:
                raise CleanupPending(f"run {run_id} is executing on another replica; it cancels there ({exc})", delay) from None
            except Exception as exc:
                await self._blocked(view, body, f"cleanup of run {run_id} is blocked: {type(exc).__name__}: {exc}", delay)
        # Whatever ended the run (a cleanup that failed while it was cancelled included), every sandbox
        # session its journal does not show finalized is finalized now.
        if engine.executor.is_executing(run_id):
            raise CleanupPending(f"run {run_id} is still stopping in this replica", delay)
        try:
            await self._finalize_leftovers(engine, run_id)
            await self._delete_retained(engine, run_id, body)
        except LeaseHeld as exc:
            raise CleanupPending(f"run {run_id} is still held by another replica ({exc})", delay) from None
        except Exception as exc:
            await self._blocked(view, body, f"cleanup of run {run_id} is blocked: {type(exc).__name__}: {exc}", delay)
        await self._cleanup_done(view, body)

    async def _delete_retained(self, engine: durable_sandbox.Engine, run_id: str, body: Mapping[str, Any]) -> None:
        """A succeeded run's retained snapshots (retainLatestSnapshot) outlive the run, not its Workflow: the
        finalized sessions skip them, so they go here (deleting a snapshot is idempotent). The journal names
        them (each session's finalize record), not status: status is a projection, and a replica that did
        not execute the run's end may have written it from fewer rows (an older snapshot as the latest)."""
        # With spec.sandboxRef the snapshots are the Sandbox resource's: never deleted here.
        if (body.get("spec") or {}).get("sandboxRef"):
            return
        providers: dict[str, str] = {}  # session id -> its provider (pinned for the whole run)
        retained: list[tuple[str, str]] = []
        for row in await engine.store.load_journal(run_id):
            session, meta = row.op_id.rsplit("/", 1)[0], row.meta or {}
            if row.kind == OpKind.SANDBOX_PROVISION.value and meta.get("provider"):
                providers[session] = str(meta["provider"])
            elif row.kind == OpKind.SANDBOX_DESTROY.value and row.status == "completed" and meta.get("retained"):
                retained.append((session, str(meta["retained"])))
        shown = str(((body.get("status") or {}).get("sandbox") or {}).get("provider") or "")
        for session, snapshot_id in retained:
            await self._provider(providers.get(session) or shown).delete_snapshot(snapshot_id)

    async def _finalize_leftovers(self, engine: durable_sandbox.Engine, run_id: str) -> None:
        executor = engine.executor
        hook = executor.services.get("cancel_cleanup")
        if hook is None:
            return
        async with contextlib.AsyncExitStack() as stack:
            lease = await engine.store.claim(run_id, executor.worker_id, executor.lease_ttl)
            stack.push_async_callback(engine.store.release, lease)
            run = await engine.store.get_run(run_id)
            if run is not None:
                await hook(executor, run, lease)

    async def _cleanup_from_status(self, view: RunView, body: Mapping[str, Any], delay: float) -> None:
        """The run's objects are gone already: the ids cleanup needs are in status too."""
        st = body.get("status") or {}
        sandbox = st.get("sandbox") or {}
        provider_name = sandbox.get("provider")
        if not provider_name:
            return
        try:
            provider = self._provider(provider_name)
            from durable_sandbox.providers.contract import SandboxHandle

            if st.get("latestSnapshot"):
                await provider.delete_snapshot(st["latestSnapshot"])
            # A Sandbox resource's sandbox (spec.sandboxRef) outlives the Workflow: never destroyed here.
            if sandbox.get("providerId") and not (body.get("spec") or {}).get("sandboxRef"):
                await provider.destroy(SandboxHandle(id=sandbox["providerId"], provider=provider_name))
        except Exception as exc:
            await self._blocked(view, body, f"cleanup from status is blocked: {type(exc).__name__}: {exc}", delay)

    async def _blocked(self, view: RunView, body: Mapping[str, Any], message: str, delay: float) -> None:
        view.extra.cleanup_blocked = message
        self.events_for_body(body, LifecycleEvent("CleanupBlocked", message[:1024], "Warning"))
        await self._patch_conditions(view, body)
        raise CleanupPending(message, delay)

    async def _cleanup_done(self, view: RunView, body: Mapping[str, Any]) -> None:
        await self._let_go(view)
        if view.extra.cleanup_blocked is not None:
            view.extra.cleanup_blocked = None
            await self._patch_conditions(view, body)
        await self.events.emit(dict(body), LifecycleEvent("CleanupDone", f"run {view.run_id}: sandboxes and snapshots deleted"))

    def events_for_body(self, body: Mapping[str, Any], event: LifecycleEvent) -> None:
        task = asyncio.get_running_loop().create_task(self.events.emit(dict(body), event))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _patch_conditions(self, view: RunView, body: Mapping[str, Any]) -> None:
        view.body = body
        with contextlib.suppress(Exception):
            await self._patch_status(view, {"conditions": self.status_of(view)["conditions"]})

    # ------------------------------------------------------------------ lifecycle of the process

    async def shutdown(self) -> None:
        """SIGTERM: hand every run executing here over at a call boundary (never finalize), release leases."""
        self.stopping = True
        self._stopped.set()
        for run_id in list(self._parked):
            self._unpark(run_id)
        for view in list(self._views.values()):
            view.wake.set()
        for engine in self._engines.values():
            for run_id in list(self._views):
                engine.executor.hand_over(run_id, "the operator replica is stopping")
        # Each active run stops at its next call boundary (a call that outlasts handover_grace is abandoned
        # and runs again elsewhere with the same operation id); what is still running then is cancelled.
        tasks = list(self._active.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=30.0)

    async def aclose(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)
        for engine in self._engines.values():
            with contextlib.suppress(Exception):
                await engine.aclose()


_MISSING = object()


def _total_calls(plan: RunPlan) -> int | None:
    if isinstance(plan.input, dict) and isinstance(plan.input.get("toolCalls"), list):
        return len(plan.input["toolCalls"])
    return None
