"""Orphan sweep: which sandboxes and snapshots of this installation no live resource claims, and removing them.

A sandbox or snapshot leaks when an operator dies between the provider's create and the journal commit that
records it, or when a Workflow (or Sandbox) resource disappears without its cleanup having run (its finalizer
removed by hand, its namespace force-cleaned). Provider-side lease expiry bounds a sandbox's leak in time
(not a snapshot's); this sweep bounds both to about ``grace`` plus one sweep period.

Every sandbox the operator creates is labelled with the installation (``INSTALLATION_LABEL``) and tagged with
its owner resource (``<namespace>/<uid>`` of the Workflow or Sandbox); snapshots keep both (providers with the
``inventory`` capability; e2b as digests in the snapshot's name). The decision (:func:`plan_sweep`) is pure:
the provider's inventory for our installation, the live owners (with the sandboxes and snapshots each
references, when known), the previous sweep's memory and a clock in; what to remove out.

Rules, each chosen so that the sweep can only err on the side of keeping:

* nothing whose installation label is not exactly ours is touched, whatever the inventory returned (a
  provider whose filter is broken must not make us destroy someone else's sandbox);
* an item is an orphan when its owner is no live resource, or a live resource that says which sandboxes
  (snapshots) it references and this one is not among them; a live resource whose references are unknown
  (a run in progress) keeps all of its items;
* a snapshot marked retained (its session may hand it over to the user) or referenced by any resource
  (``spec.fromSnapshot``) is never removed;
* an orphan is removed only after it was seen orphaned on sweeps spanning ``grace`` seconds; seeing it
  claimed again resets its clock. The caller lists the inventory *before* the live resources, so an owner
  missing from the listing was deleted (resources exist before anything is made for them); the grace
  covers status that lags behind the journal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    ProviderError,
    SandboxHandle,
    SandboxProvider,
    SnapshotEntry,
    tag_key,
)

__all__ = [
    "Inventory",
    "LiveOwner",
    "Orphan",
    "SweepPlan",
    "SweepResult",
    "execute_plan",
    "plan_sweep",
    "sweep_once",
    "take_inventory",
]

log = logging.getLogger("durable_sandbox.kube.sweep.orphans")


@dataclass(frozen=True)
class LiveOwner:
    """A live Workflow or Sandbox resource by its owner tag. ``None`` references: unknown, keep everything."""

    owner: str
    sandbox_ids: frozenset[str] | None = None
    snapshot_ids: frozenset[str] | None = None


@dataclass(frozen=True)
class Inventory:
    sandboxes: tuple[SandboxHandle, ...]
    snapshots: tuple[SnapshotEntry, ...]


@dataclass(frozen=True)
class Orphan:
    kind: Literal["sandbox", "snapshot"]
    id: str
    reason: str
    orphaned_since: float
    owner: str | None = None  # the owner tag, when the item carries it in clear (sandboxes)
    handle: SandboxHandle | None = None  # what destroy needs (sandboxes)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass(frozen=True)
class SweepPlan:
    destroy: tuple[Orphan, ...]
    # Orphans still inside the grace period: "<kind>:<id>" -> when first seen orphaned. Feed to the next sweep.
    waiting: dict[str, float] = field(default_factory=dict)
    kept: int = 0  # items a live resource claims (or retained snapshots)
    foreign: tuple[str, ...] = ()  # listed but not carrying our installation label: never touched


def _sandbox_reason(handle: SandboxHandle, live: Mapping[str, LiveOwner]) -> str | None:
    owner = handle.metadata.get("owner")
    if not isinstance(owner, str) or not owner:
        return "it has no owner tag, so no resource can claim it"
    resource = live.get(owner)
    if resource is None:
        return f"its owner {owner} is no live Workflow or Sandbox resource (deleted without cleanup?)"
    if resource.sandbox_ids is not None and handle.id not in resource.sandbox_ids:
        return f"its owner {owner} no longer references it"
    return None


def _snapshot_reason(entry: SnapshotEntry, by_key: Mapping[str, LiveOwner]) -> str | None:
    if entry.owner_key is None:
        return "it has no owner tag, so no resource can claim it"
    resource = by_key.get(entry.owner_key)
    if resource is None:
        return f"its owner (key {entry.owner_key}) is no live Workflow or Sandbox resource (deleted without cleanup?)"
    if resource.snapshot_ids is not None and entry.id not in resource.snapshot_ids:
        return f"its owner {resource.owner} no longer references it"
    return None


def plan_sweep(
    inventory: Inventory,
    *,
    installation: str,
    live: Mapping[str, LiveOwner],
    first_seen: Mapping[str, float],
    now: float,
    grace: float,
    protected: frozenset[str] = frozenset(),
) -> SweepPlan:
    """What to remove now (see the module docstring for the rules). ``first_seen`` is the previous plan's
    ``waiting``; orphans not listed any more are forgotten. ``protected``: snapshot ids some resource names."""
    if grace < 0:
        raise ValueError(f"the orphan grace period must be >= 0 seconds, got {grace}")
    destroy: list[Orphan] = []
    waiting: dict[str, float] = {}
    kept = 0
    foreign: list[str] = []

    def judge(orphan: Orphan) -> None:
        since = first_seen.get(orphan.key, now)
        if now - since >= grace:
            destroy.append(Orphan(orphan.kind, orphan.id, orphan.reason, since, orphan.owner, orphan.handle))
        else:
            waiting[orphan.key] = since

    for handle in inventory.sandboxes:
        labels = handle.metadata.get("labels")
        if not isinstance(labels, Mapping) or labels.get(INSTALLATION_LABEL) != installation:
            foreign.append(handle.id)
            continue
        reason = _sandbox_reason(handle, live)
        if reason is None:
            kept += 1
            continue
        owner = handle.metadata.get("owner")
        judge(Orphan("sandbox", handle.id, reason, now, owner if isinstance(owner, str) else None, handle))
    ours = tag_key(installation)
    by_key = {tag_key(owner): resource for owner, resource in live.items()}
    for entry in inventory.snapshots:
        if entry.installation_key != ours:
            foreign.append(entry.id)
            continue
        reason = None if entry.retained or entry.id in protected else _snapshot_reason(entry, by_key)
        if reason is None:
            kept += 1
            continue
        resource = by_key.get(entry.owner_key) if entry.owner_key is not None else None
        judge(Orphan("snapshot", entry.id, reason, now, resource.owner if resource is not None else None))
    return SweepPlan(tuple(destroy), waiting, kept, tuple(foreign))


@dataclass(frozen=True)
class SweepResult:
    plan: SweepPlan
    destroyed: tuple[Orphan, ...]
    failed: tuple[tuple[Orphan, str], ...]  # (orphan, error) to retry on the next sweep


async def take_inventory(provider: SandboxProvider, installation: str) -> Inventory:
    """Everything ``provider`` holds for ``installation`` (raises UnsupportedCapability without ``inventory``)."""
    sandboxes = await provider.inventory_sandboxes(installation)
    snapshots = await provider.inventory_snapshots(installation)
    return Inventory(tuple(sandboxes), tuple(snapshots))


async def execute_plan(
    provider: SandboxProvider, plan: SweepPlan, *, on_destroyed: Callable[[Orphan], None] | None = None
) -> SweepResult:
    """Remove the plan's orphans (one log line each, and ``on_destroyed`` for an Event or a metric). A removal
    that fails is logged and kept waiting, so the next sweep retries it at once."""
    destroyed: list[Orphan] = []
    failed: list[tuple[Orphan, str]] = []
    for orphan in plan.destroy:
        try:
            if orphan.handle is not None:
                await provider.destroy(orphan.handle)
            else:
                await provider.delete_snapshot(orphan.id)
        except ProviderError as e:
            log.warning("orphan sweep: removing %s %s of provider %s failed (%s); retrying next sweep",
                        orphan.kind, orphan.id, provider.name, e)
            failed.append((orphan, str(e)))
            plan.waiting[orphan.key] = orphan.orphaned_since
            continue
        log.info("orphan sweep: destroyed %s %s of provider %s: %s", orphan.kind, orphan.id, provider.name,
                 orphan.reason)
        destroyed.append(orphan)
        if on_destroyed is not None:
            on_destroyed(orphan)
    return SweepResult(plan, tuple(destroyed), tuple(failed))


async def sweep_once(
    provider: SandboxProvider,
    *,
    installation: str,
    live: Mapping[str, LiveOwner],
    first_seen: Mapping[str, float],
    now: float,
    grace: float,
    protected: frozenset[str] = frozenset(),
    on_destroyed: Callable[[Orphan], None] | None = None,
) -> SweepResult:
    """One sweep of one provider against a known set of live owners. (The operator's sweeper lists every
    provider's inventory first and the live resources after, see kube/sweep/sweeper.py.) The caller keeps
    ``result.plan.waiting`` for the next sweep."""
    inventory = await take_inventory(provider, installation)
    plan = plan_sweep(inventory, installation=installation, live=live, first_seen=first_seen, now=now, grace=grace,
                      protected=protected)
    return await execute_plan(provider, plan, on_destroyed=on_destroyed)
