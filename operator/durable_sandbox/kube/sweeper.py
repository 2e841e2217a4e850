"""The orphan sweep on a timer (``dsb operator --sweep-interval/--sweep-grace``), over every provider this
operator may use that can list an installation's inventory (kube/orphans.py has the rules).

One sweep: (1) each provider's inventory for our installation, (2) then the live Workflow and Sandbox
resources in the namespaces this operator serves, (3) a plan per provider, carried from sweep to sweep
(so an orphan is removed only once seen orphaned for the whole grace period), (4) removals, each with a
log line, a metric and, when its owner resource still exists, an Event on it. Listing the inventory first
matters: a resource always exists before anything is made for it, so an owner missing from the later
listing was deleted. If the live resources cannot be listed completely, nothing is removed that round.

What a live resource references:
* a Workflow in progress (any phase but Succeeded/Failed/Cancelled) or being deleted: unknown, so everything
  tagged with it is kept (its run reaps what it made but did not record; its finalizer cleans up);
* a finished Workflow: nothing (its sessions were finalized; a retained snapshot is marked as such);
* a Sandbox resource: ``status.providerId`` and ``status.snapshots``, unless an operation is in flight
  (``status.operation``): then unknown. Any ``spec.fromSnapshot`` is protected whoever made it.

Several replicas each run the timer; their sweeps may overlap, which is harmless (removals are idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from durable_sandbox.kube.client import KubeClient
from durable_sandbox.kube.events import EventRecorder, LifecycleEvent
from durable_sandbox.kube.metrics import OperatorMetrics
from durable_sandbox.kube.orphans import (
    Inventory,
    LiveOwner,
    Orphan,
    SweepResult,
    execute_plan,
    plan_sweep,
    take_inventory,
)
from durable_sandbox.kube.resources import SANDBOXES, WORKFLOWS, CustomObjects
from durable_sandbox.kube.status import TERMINAL_PHASES
from durable_sandbox.providers.contract import Capability, SandboxProvider

__all__ = ["DEFAULT_SWEEP_GRACE", "DEFAULT_SWEEP_INTERVAL", "OrphanSweeper", "default_installation_id", "live_owners"]

log = logging.getLogger("durable_sandbox.kube.sweeper")

DEFAULT_SWEEP_INTERVAL = 300.0
# Longer than any provision-to-journal or status lag, so a sandbox made a moment ago is never raced.
DEFAULT_SWEEP_GRACE = 600.0


def default_installation_id(namespaces: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> str:
    """The chart passes ``<release namespace>/<release name>``. Run by hand: ``namespaces:<a>,<b>`` for an
    operator serving some namespaces (so operators serving different namespaces, whose live resources differ,
    never sweep each other's sandboxes), else ``<$POD_NAMESPACE>/durable-sandbox`` or ``durable-sandbox``."""
    if namespaces:
        return "namespaces:" + ",".join(sorted(set(namespaces)))
    env = os.environ if environ is None else environ
    namespace = env.get("POD_NAMESPACE")
    return f"{namespace}/durable-sandbox" if namespace else "durable-sandbox"


def live_owners(workflows: Sequence[Mapping[str, Any]], sandboxes: Sequence[Mapping[str, Any]]) -> tuple[
        dict[str, LiveOwner], frozenset[str], dict[str, Mapping[str, Any]]]:
    """(live owners by owner tag, snapshot ids some spec names, the resource body of each owner)."""
    live: dict[str, LiveOwner] = {}
    protected: set[str] = set()
    bodies: dict[str, Mapping[str, Any]] = {}
    for wf in workflows:
        meta = wf.get("metadata") or {}
        owner = f"{meta.get('namespace')}/{meta.get('uid')}"
        bodies[owner] = wf
        phase = (wf.get("status") or {}).get("phase")
        if meta.get("deletionTimestamp") or phase not in TERMINAL_PHASES:
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
        status = sb.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("operation"):
            live[owner] = LiveOwner(owner)
            continue
        provider_id = status.get("providerId")
        live[owner] = LiveOwner(
            owner,
            frozenset({provider_id}) if isinstance(provider_id, str) and provider_id else frozenset(),
            frozenset(s for s in status.get("snapshots") or [] if isinstance(s, str)),
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.objects = CustomObjects(api)
        self.installation = installation
        self.namespaces = namespaces
        self._providers = providers
        self.grace = grace
        self.events = events
        self.metrics = metrics
        self._clock = clock
        self._first_seen: dict[str, dict[str, float]] = {}  # provider -> the previous plan's waiting
        self._background: set[asyncio.Task[Any]] = set()

    async def run(self, interval: float, stopped: asyncio.Event) -> None:
        """Sweep every ``interval`` seconds until ``stopped``; a failed sweep is logged and retried next time."""
        while not stopped.is_set():
            try:
                await self.sweep()
            except Exception as exc:  # never let the timer die: the next sweep may succeed
                self.metrics.orphan_sweeps.labels(outcome="error").inc()
                log.warning("orphan sweep failed (%s: %s); trying again in %gs", type(exc).__name__, exc, interval)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=interval)

    async def _list(self, plural: str) -> list[dict[str, Any]]:
        if not self.namespaces:
            return await self.objects.list(plural)
        items: list[dict[str, Any]] = []
        for namespace in self.namespaces:
            items.extend(await self.objects.list(plural, namespace))
        return items

    async def sweep(self) -> dict[str, SweepResult]:
        inventories: dict[str, tuple[SandboxProvider, Inventory]] = {}
        for name, provider in self._providers().items():
            if not provider.capabilities().supports(Capability.INVENTORY):
                continue
            try:
                inventories[name] = (provider, await take_inventory(provider, self.installation))
            except Exception as exc:  # one provider's outage does not stop the others' sweep
                log.warning("orphan sweep: listing provider %s failed (%s: %s); skipped this round",
                            name, type(exc).__name__, exc)
        live, protected, bodies = live_owners(await self._list(WORKFLOWS), await self._list(SANDBOXES))
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
