"""The orphan sweep on a timer (``dsb operator --sweep-interval/--sweep-grace``), over every provider this
operator may use that can list an installation's inventory (kube/sweep/orphans.py has the rules).

One sweep: (1) each provider's inventory for our installation, (2) then the live Workflow and Sandbox
resources in the namespaces this operator serves, (3) a plan per provider, carried from sweep to sweep
(so an orphan is removed only once seen orphaned for the whole grace period), (4) removals, each with a
log line, a metric and, when its owner resource still exists, an Event on it. Listing the inventory first
matters: a resource always exists before anything is made for it, so an owner missing from the later
listing was deleted. If the live resources cannot be listed completely, nothing is removed that round.

What a live resource references, from what only the operator writes (never status: anyone granted
``*/status`` could otherwise make the sweep destroy a running Workflow's sandbox or a Sandbox's live one):
* a Workflow whose run has not finished (by its sealed journal records, ``kube/store/finished.py``: never a
  label or annotation of a Journal head, which a namespace's worker ServiceAccount may write; where workers hold
  the namespace's key, only a worker Workflow's: :meth:`OrphanSweeper._believed`), has not started, or that is
  being deleted: unknown, so everything tagged with it is kept (its run reaps what it made but did not record;
  its finalizer cleans up);
* a Workflow whose run finished: nothing (its sessions were finalized; a retained snapshot is marked as such);
* a Sandbox resource: ``providerId`` and ``snapshots`` of its record (``kube/journal/sandbox_records.py``), and the
  snapshots its session calls took (their journal, ``spec.snapshotEveryNCalls``), unless an operation is in flight
  there or it has no readable record: then unknown. Any ``spec.fromSnapshot`` is protected whoever made it, and so
  is any snapshot a Sandbox's session journal holds (a fork's copy of its source's keeps the source's owner tag).

Several replicas each run the timer; their sweeps may overlap, which is harmless (removals are idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from durable_sandbox.kube.api.client import KubeClient, brief, is_transient
from durable_sandbox.kube.api.resources import SANDBOXES, WORKFLOWS, CustomObjects
from durable_sandbox.kube.journal.sandbox_records import SandboxRecords
from durable_sandbox.kube.reporting.events import EventRecorder, LifecycleEvent
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.store import run_key
from durable_sandbox.kube.store.finished import FinishedRuns
from durable_sandbox.kube.sweep.orphans import (
    Inventory,
    LiveOwner,
    Orphan,
    SweepResult,
    execute_plan,
    plan_sweep,
    take_inventory,
)
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.providers.contract import Capability, SandboxProvider

__all__ = ["DEFAULT_SWEEP_GRACE", "DEFAULT_SWEEP_INTERVAL", "OrphanSweeper", "default_installation_id", "live_owners"]

log = logging.getLogger("durable_sandbox.kube.sweep.sweeper")

DEFAULT_SWEEP_INTERVAL = 300.0
# Longer than any provision-to-journal or status lag, so a sandbox made a moment ago is never raced.
DEFAULT_SWEEP_GRACE = 600.0
RETRY_FIRST = 2.0  # seconds after a failed sweep before the next try, doubling up to RETRY_MAX
RETRY_MAX = 60.0


def default_installation_id(namespaces: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> str:
    """The chart passes ``<release namespace>/<release name>``. Run by hand: ``namespaces:<a>,<b>`` for an
    operator serving some namespaces (so operators serving different namespaces, whose live resources differ,
    never sweep each other's sandboxes), else ``<$POD_NAMESPACE>/durable-sandbox`` or ``durable-sandbox``."""
    if namespaces:
        return "namespaces:" + ",".join(sorted(set(namespaces)))
    env = os.environ if environ is None else environ
    namespace = env.get("POD_NAMESPACE")
    return f"{namespace}/durable-sandbox" if namespace else "durable-sandbox"


def live_owners(workflows: Sequence[Mapping[str, Any]], sandboxes: Sequence[Mapping[str, Any]], *,
                finished_runs: frozenset[str], records: Mapping[str, Mapping[str, Any] | None],
                session_snapshots: Mapping[str, frozenset[str]] | None = None) -> tuple[
        dict[str, LiveOwner], frozenset[str], dict[str, Mapping[str, Any]]]:
    """(live owners by owner tag, snapshot ids some spec names, the resource body of each owner).

    ``finished_runs``: ``<namespace>/<run key>`` of every run whose journal says it finished; ``records``: each
    Sandbox's record by uid (None: it cannot be read); ``session_snapshots``: each Sandbox's session calls'
    snapshots by uid (from their journal)."""
    live: dict[str, LiveOwner] = {}
    protected: set[str] = set()
    bodies: dict[str, Mapping[str, Any]] = {}
    for wf in workflows:
        meta = wf.get("metadata") or {}
        owner = f"{meta.get('namespace')}/{meta.get('uid')}"
        bodies[owner] = wf
        run = f"{meta.get('namespace')}/{run_key(cluster_run_id(str(meta.get('name')), str(meta.get('uid'))))}"
        if meta.get("deletionTimestamp") or run not in finished_runs:
            live[owner] = LiveOwner(owner)
        else:
            live[owner] = LiveOwner(owner, frozenset(), frozenset())
    for sb in sandboxes:
        meta = sb.get("metadata") or {}
        owner = f"{meta.get('namespace')}/{meta.get('uid')}"
        bodies[owner] = sb
        source = (sb.get("spec") or {}).get("fromSnapshot")
        if isinstance(source, str) and source:
            protected.add(source)
        # A fork's copy of its source's snapshot (sessions/fork_restore.py) is the fork's session's, tagged with the
        # source as owner (a copy keeps its tags): what a live Sandbox's journal holds is never an orphan.
        protected |= (session_snapshots or {}).get(str(meta.get("uid")), frozenset())
        record = records.get(str(meta.get("uid")))
        if meta.get("deletionTimestamp") or record is None or record.get("operation"):
            live[owner] = LiveOwner(owner)
            continue
        provider_id = record.get("providerId")
        live[owner] = LiveOwner(
            owner,
            frozenset({provider_id}) if isinstance(provider_id, str) and provider_id else frozenset(),
            frozenset(s for s in record.get("snapshots") or [] if isinstance(s, str))
            | (session_snapshots or {}).get(str(meta.get("uid")), frozenset()),
        )
    return live, frozenset(protected), bodies


class OrphanSweeper:
    def __init__(
        self,
        api: KubeClient,
        *,
        installation: str,
        namespaces: list[str],
        providers: Callable[[], Mapping[str, SandboxProvider]],
        grace: float,
        events: EventRecorder,
        metrics: OperatorMetrics,
        records: SandboxRecords,
        finished_runs: Callable[[str], Awaitable[FinishedRuns]],
        clock: Callable[[], float] = time.monotonic,
        session_snapshots: Callable[[str, str], Awaitable[frozenset[str]]] | None = None,
        worker_keyed: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.api = api
        # A namespace's finished runs by their sealed journal records (kube/store/finished.py), never by labels.
        self.finished_runs = finished_runs
        self._ignored: dict[str, frozenset[str]] = {}  # namespace -> heads ignored last round (each said once)
        # Whether a namespace's key was handed to its workers (kube/journal/worker_key.py); None: never.
        self.worker_keyed = worker_keyed
        # (namespace, Sandbox uid) -> the snapshots its session calls took (kube/sandbox/checkpoints.py), which its
        # record does not list; None: none are taken here.
        self.session_snapshots = session_snapshots
        self.records = records
        self.objects = CustomObjects(api)
        self.installation = installation
        self.namespaces = namespaces
        self._providers = providers
        self.grace = grace
        self.events = events
        self.metrics = metrics
        self._clock = clock
        self._first_seen: dict[str, dict[str, float]] = {}  # provider -> the previous plan's waiting
        self._listing_failed: dict[str, str] = {}  # provider -> why its inventory could not be listed last round
        self._background: set[asyncio.Task[Any]] = set()

    async def run(self, interval: float, stopped: asyncio.Event) -> None:
        """Sweep every ``interval`` seconds until ``stopped``. A failed sweep is tried again soon, with a backoff
        from ``RETRY_FIRST`` doubling up to ``RETRY_MAX`` (never later than ``interval``): the first sweep of a
        start used to meet an API server still initializing and then wait the whole interval. The API server not
        answering is said once (the client's ApiServerAway); any other failure is a WARNING (one line) per try."""
        failures = 0
        while not stopped.is_set():
            delay = interval
            try:
                await self.sweep()
                failures = 0
            except Exception as exc:  # never let the timer die: the next sweep may succeed
                failures += 1
                delay = min(interval, RETRY_FIRST * 2 ** min(failures - 1, 16), RETRY_MAX)
                self.metrics.orphan_sweeps.labels(outcome="error").inc()
                if is_transient(exc):
                    self.api.away.failed("the orphan sweep")
                    log.debug("orphan sweep failed (%s); trying again in %gs", brief(exc), delay)
                else:
                    log.warning("orphan sweep failed (%s); trying again in %gs", brief(exc), delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=delay)

    async def _list(self, plural: str) -> list[dict[str, Any]]:
        if not self.namespaces:
            return await self.objects.list(plural)
        items: list[dict[str, Any]] = []
        for namespace in self.namespaces:
            items.extend(await self.objects.list(plural, namespace))
        return items

    async def _operator_state(self, workflows: Sequence[Mapping[str, Any]], sandboxes: Sequence[Mapping[str, Any]]
                              ) -> tuple[frozenset[str], dict[str, Mapping[str, Any] | None]]:
        """What only the operator writes, for the namespaces those resources are in: the runs that finished (by
        their sealed journal records) and the Sandboxes' records."""
        namespaces = {str((o.get("metadata") or {}).get("namespace")) for o in [*workflows, *sandboxes]}
        finished: set[str] = set()
        records: dict[str, Mapping[str, Any] | None] = {}
        for namespace in sorted(namespaces):
            runs = await self.finished_runs(namespace)
            self._say_ignored(namespace, runs.ignored)
            finished.update(f"{namespace}/{key}" for key in await self._believed(namespace, workflows, runs.keys))
            records.update(await self.records.all(namespace))
        return frozenset(finished), records

    async def _believed(self, namespace: str, workflows: Sequence[Mapping[str, Any]], keys: frozenset[str]
                        ) -> frozenset[str]:
        """The finished runs among ``keys`` the sweep acts on: all, unless ``namespace``'s key was handed to workers
        (a Workflow there has ``spec.worker``, or its worker-key Secret exists): a worker can then seal what the
        operator seals, so only worker Workflows' runs, whose journal is their team's word anyway, are taken as
        finished; the others keep what they hold until they are deleted (then their owner is gone)."""
        workers: set[str] = set()
        for wf in workflows:
            meta = wf.get("metadata") or {}
            if meta.get("namespace") == namespace and (wf.get("spec") or {}).get("worker"):
                workers.add(run_key(cluster_run_id(str(meta.get("name")), str(meta.get("uid")))))
        keyed = bool(workers) or (self.worker_keyed is not None and await self.worker_keyed(namespace))
        return keys & frozenset(workers) if keyed else keys

    def _say_ignored(self, namespace: str, ignored: Sequence[tuple[str, str]]) -> None:
        """A WARNING for each journal head the sweep ignored, once while it stays so (again if it comes back)."""
        before = self._ignored.get(namespace, frozenset())
        for name, why in ignored:
            if name not in before:
                log.warning("orphan sweep: Journal %s/%s is ignored: %s. Its run is taken as not finished, so "
                            "nothing its Workflow holds is removed; a cluster administrator should find out who "
                            "wrote it", namespace, name, why)
        self._ignored[namespace] = frozenset(name for name, _ in ignored)

    async def _session_snapshots(self, sandboxes: Sequence[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
        if self.session_snapshots is None:
            return {}
        out: dict[str, frozenset[str]] = {}
        for sb in sandboxes:
            meta = sb.get("metadata") or {}
            out[str(meta.get("uid"))] = await self.session_snapshots(str(meta.get("namespace")), str(meta.get("uid")))
        return out

    async def sweep(self) -> dict[str, SweepResult]:
        inventories: dict[str, tuple[SandboxProvider, Inventory]] = {}
        for name, provider in self._providers().items():
            if not provider.capabilities().supports(Capability.INVENTORY):
                continue
            try:
                inventories[name] = (provider, await take_inventory(provider, self.installation))
            except Exception as exc:  # one provider's outage does not stop the others' sweep
                if self._listing_failed.get(name) != brief(exc):  # said once, not at every round it lasts
                    log.warning("orphan sweep: listing provider %s failed (%s); skipped until it answers",
                                name, brief(exc))
                self._listing_failed[name] = brief(exc)
                continue
            if self._listing_failed.pop(name, None) is not None:
                log.info("orphan sweep: provider %s lists its inventory again", name)
        workflows, sandboxes = await self._list(WORKFLOWS), await self._list(SANDBOXES)
        finished, records = await self._operator_state(workflows, sandboxes)
        taken = await self._session_snapshots(sandboxes)
        live, protected, bodies = live_owners(workflows, sandboxes, finished_runs=finished, records=records,
                                              session_snapshots=taken)
        now = self._clock()
        results: dict[str, SweepResult] = {}
        for name, (provider, inventory) in inventories.items():
            plan = plan_sweep(inventory, installation=self.installation, live=live, protected=protected,
                              first_seen=self._first_seen.get(name, {}), now=now, grace=self.grace)

            def removed(orphan: Orphan, provider_name: str = name) -> None:
                self._report(provider_name, orphan, bodies)

            results[name] = await execute_plan(provider, plan, on_destroyed=removed)
            self._first_seen[name] = plan.waiting
        self.metrics.orphan_sweeps.labels(outcome="ok").inc()
        return results

    def _report(self, provider: str, orphan: Orphan, bodies: Mapping[str, Mapping[str, Any]]) -> None:
        counter = self.metrics.orphans_destroyed if orphan.kind == "sandbox" else self.metrics.orphan_snapshots_destroyed
        counter.labels(provider=provider).inc()
        body = bodies.get(orphan.owner) if orphan.owner is not None else None
        if body is not None:  # the owner still exists (it no longer references the item): tell its users
            message = f"orphan sweep destroyed {orphan.kind} {orphan.id} of provider {provider}: {orphan.reason}"
            task = asyncio.get_running_loop().create_task(
                self.events.emit(dict(body), LifecycleEvent("OrphanDestroyed", message[:1024])))
            self._background.add(task)  # emit() logs its own failures
            task.add_done_callback(self._background.discard)
