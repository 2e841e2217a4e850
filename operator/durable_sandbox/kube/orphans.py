"""Orphan sweep: which sandboxes tagged with this installation's owner no live run claims, and destroying them.

A sandbox leaks when an operator dies between the provider's create and the journal commit that records it,
or when a Workflow (or Sandbox) resource disappears without its cleanup having run. Provider-side lease
expiry bounds such a leak in time; this sweep bounds it to about ``grace`` plus one sweep period.

The decision (:func:`plan_sweep`) is pure: the provider's listing for our owner tag, the live runs (the run
ids of live Workflow/Sandbox resources, with the sandbox ids each references when known), the previous
sweep's memory and a clock in; what to destroy out. :func:`sweep_once` runs one sweep against a provider.

Rules, each chosen so that the sweep can only err on the side of keeping:

* a sandbox whose ``metadata["owner"]`` is not exactly our tag is never touched, whatever the listing
  returned (a provider whose owner filter is broken must not make us destroy someone else's sandbox);
* a sandbox is an orphan when its ``durable-sandbox.dev/run-id`` label names no live run, or names a live run
  that says which sandboxes it references and this one is not among them (a replacement was provisioned
  after a crash); a live run whose references are unknown keeps all of its sandboxes;
* an orphan is destroyed only after it was seen orphaned on sweeps spanning ``grace`` seconds, so a sandbox
  provisioned a moment ago, whose run has not yet journaled it or whose resource the caller's list has not
  yet seen, is not raced. Seeing it claimed again resets its clock.

Snapshots are not swept: the provider contract can list sandboxes by owner but not snapshots (the local
provider's snapshots carry no owner, e2b's are named by operation id only). Finalizers delete the snapshots
of deleted resources; see docs/reliability.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from durable_sandbox.providers.contract import ProviderError, SandboxHandle, SandboxProvider

__all__ = ["RUN_ID_LABEL", "LiveRun", "Orphan", "SweepPlan", "SweepResult", "plan_sweep", "sweep_once"]

log = logging.getLogger("durable_sandbox.kube.orphans")

RUN_ID_LABEL = "durable-sandbox.dev/run-id"


@dataclass(frozen=True)
class LiveRun:
    """A run some live resource stands for. ``sandbox_ids`` None: which sandboxes it references is unknown."""

    run_id: str
    sandbox_ids: frozenset[str] | None = None


@dataclass(frozen=True)
class Orphan:
    handle: SandboxHandle
    reason: str
    orphaned_since: float


@dataclass(frozen=True)
class SweepPlan:
    destroy: tuple[Orphan, ...]
    # Orphans still inside the grace period: sandbox id -> when first seen orphaned. Feed to the next sweep.
    waiting: dict[str, float] = field(default_factory=dict)
    kept: int = 0  # sandboxes a live run claims
    foreign: tuple[str, ...] = ()  # listed but not carrying our owner tag: never touched


def _run_id(handle: SandboxHandle) -> str | None:
    labels = handle.metadata.get("labels")
    run_id = labels.get(RUN_ID_LABEL) if isinstance(labels, Mapping) else None
    return run_id if isinstance(run_id, str) and run_id else None


def _orphan_reason(handle: SandboxHandle, live: Mapping[str, LiveRun]) -> str | None:
    run_id = _run_id(handle)
    if run_id is None:
        return f"it has no {RUN_ID_LABEL} label, so no run can claim it"
    run = live.get(run_id)
    if run is None:
        return f"no live Workflow or Sandbox resource has run {run_id}"
    if run.sandbox_ids is not None and handle.id not in run.sandbox_ids:
        return f"run {run_id} no longer references it"
    return None


def plan_sweep(
    handles: Iterable[SandboxHandle],
    *,
    owner: str,
    live: Mapping[str, LiveRun],
    first_seen: Mapping[str, float],
    now: float,
    grace: float,
) -> SweepPlan:
    """What to destroy now (see the module docstring for the rules). ``first_seen`` is the previous plan's
    ``waiting``; orphans not listed any more are forgotten."""
    if grace < 0:
        raise ValueError(f"the orphan grace period must be >= 0 seconds, got {grace}")
    destroy: list[Orphan] = []
    waiting: dict[str, float] = {}
    kept = 0
    foreign: list[str] = []
    for handle in handles:
        if handle.metadata.get("owner") != owner:
            foreign.append(handle.id)
            continue
        reason = _orphan_reason(handle, live)
        if reason is None:
            kept += 1
            continue
        since = first_seen.get(handle.id, now)
        if now - since >= grace:
            destroy.append(Orphan(handle, reason, since))
        else:
            waiting[handle.id] = since
    return SweepPlan(tuple(destroy), waiting, kept, tuple(foreign))


@dataclass(frozen=True)
class SweepResult:
    plan: SweepPlan
    destroyed: tuple[Orphan, ...]
    failed: tuple[tuple[Orphan, str], ...]  # (orphan, error) to retry on the next sweep


async def sweep_once(
    provider: SandboxProvider,
    *,
    owner: str,
    live: Mapping[str, LiveRun],
    first_seen: Mapping[str, float],
    now: float,
    grace: float,
    on_destroyed: Callable[[Orphan], None] | None = None,
) -> SweepResult:
    """List ``provider``'s sandboxes of ``owner``, destroy the orphans past their grace period (one log line
    each, and ``on_destroyed`` for an Event or a metric). A destroy that fails is logged and kept waiting,
    so the next sweep retries it at once. The caller keeps ``result.plan.waiting`` for the next sweep.
    Races between the listing and ``live`` (a resource created or a sandbox journaled in between) are
    what the grace period is for: it must exceed how stale ``live`` can be."""
    handles = await provider.list_sandboxes(owner)
    plan = plan_sweep(handles, owner=owner, live=live, first_seen=first_seen, now=now, grace=grace)
    destroyed: list[Orphan] = []
    failed: list[tuple[Orphan, str]] = []
    for orphan in plan.destroy:
        try:
            await provider.destroy(orphan.handle)
        except ProviderError as e:
            log.warning("orphan sweep: destroying sandbox %s of provider %s failed (%s); retrying next sweep",
                        orphan.handle.id, provider.name, e)
            failed.append((orphan, str(e)))
            plan.waiting[orphan.handle.id] = orphan.orphaned_since
            continue
        log.info("orphan sweep: destroyed sandbox %s of provider %s: %s", orphan.handle.id, provider.name,
                 orphan.reason)
        destroyed.append(orphan)
        if on_destroyed is not None:
            on_destroyed(orphan)
    return SweepResult(plan, tuple(destroyed), tuple(failed))
