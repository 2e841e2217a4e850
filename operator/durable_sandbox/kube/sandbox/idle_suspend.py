"""``spec.idleSuspendAfterSeconds``: a live sandbox nobody held for that long is suspended under the holder
``IDLE_CLAIM`` (``kube/holders/holding.py``), so no Workflow's call runs while it is half suspended, and resumed when a
Workflow takes it (``kube/sandbox/idle.py`` plans it)."""

from __future__ import annotations

import logging
import time

from durable_sandbox.engine import faults
from durable_sandbox.kube.journal.sandbox_records import (
    ACTIVE_AT,
    HOLDER,
    IDLE_CLAIM,
    IDLE_SUSPENDED,
    SUSPENDED_AT,
)
from durable_sandbox.kube.sandbox.idle import SUSPENDED, plan_idle
from durable_sandbox.kube.sandbox.suspend import SandboxSuspend
from durable_sandbox.kube.sandbox.view import SandboxView
from durable_sandbox.kube.spec.conditions import rfc3339
from durable_sandbox.kube.spec.models import SandboxResource
from durable_sandbox.providers.contract import Capability, SandboxProvider

log = logging.getLogger("durable_sandbox.kube.sandbox.controller")

__all__ = ["SandboxIdle"]


def idle_for(after: int | None) -> str:
    return f"no call for {after}s (spec.idleSuspendAfterSeconds)" if after is not None else "idle"


class SandboxIdle(SandboxSuspend):
    """The idle timer, idle suspends and resumes."""

    async def _keep_available(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        """``spec.suspend: false``: live, unless the idle timer suspended it and no Workflow has taken it since."""
        record = await self.records.read(view.namespace, view.uid)
        if record.get(HOLDER) == IDLE_CLAIM:
            return await self._idle_suspend(view, res, provider)  # ours, interrupted (a crash, a lost lease)
        if view.status.get(IDLE_SUSPENDED):
            holder = await self.holding.running_holder(view.namespace, record)
            if view.handle() is None and holder is None and res.spec.idle_suspend_after_seconds is not None:
                # Woken when a Workflow takes it (status.holder changes, see SandboxView.notice) or the spec changes.
                return await self._stay_idle_suspended(view, res)
            delay = await self._keep_live(view, res, provider)  # restores the newest snapshot
            await self._resumed(view, holder)
        else:
            delay = await self._keep_live(view, res, provider)
        return await self._idle_timer(view, res, provider, delay)

    async def _idle_timer(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider,
                          delay: float | None) -> float | None:
        """Show the state; suspend the live sandbox if nobody has held it for ``idleSuspendAfterSeconds``."""
        if view.handle() is None:
            return delay
        record = await self.records.read(view.namespace, view.uid)
        last_active = record.get(ACTIVE_AT)
        if not isinstance(last_active, int | float):  # recorded before idle timers existed: it starts now
            last_active = time.time()
            await self.records.write(view.namespace, view.name, view.uid, {ACTIVE_AT: last_active})
        held = await self.holding.running_holder(view.namespace, record) is not None
        after = res.spec.idle_suspend_after_seconds
        plan = plan_idle(after=after, live=True, held=held, last_active=last_active, suspended_at=None, now=time.time())
        await self._show_state(view, plan)
        if not plan.suspend:
            due = None if plan.due_in is None else max(plan.due_in, 0.1)
            return due if delay is None else delay if due is None else min(delay, due)
        if not provider.capabilities().supports(Capability.SNAPSHOT):
            message = (f"provider {res.spec.provider} cannot snapshot, so spec.idleSuspendAfterSeconds cannot suspend "
                       f"it without losing the workspace; the sandbox stays live")
            if (self._condition(view, "Suspended") or {}).get("reason") != "SnapshotUnsupported":
                await self._transition(view, "Ready", Suspended=(False, "SnapshotUnsupported", message))
                await self._emit(view, "SuspendRefused", message, "Warning")
            return delay
        await faults.pause("idle:due")  # the race tests stop here: due, not yet claimed
        # The same compare-and-swap a Workflow takes the Sandbox with, and only if nobody took or let go of it
        # since it was read: either a Workflow's calls or this suspend, never both.
        if not await self.records.swap_holder(view.namespace, view.uid, record.get(HOLDER), IDLE_CLAIM,
                                              unchanged={ACTIVE_AT: record.get(ACTIVE_AT)}):
            log.info("sandbox %s/%s: the idle timer was due, but a Workflow took or let go of the Sandbox meanwhile; "
                     "not suspended", view.namespace, view.name)
            return 0.0  # plan again from the record as it is now
        return await self._idle_suspend(view, res, provider)

    async def _idle_suspend(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        """Holding ``IDLE_CLAIM``: snapshot and destroy the live sandbox, record that it is idle-suspended, let go
        (from then on a Workflow may take it, which resumes it)."""
        after = res.spec.idle_suspend_after_seconds
        if view.handle() is not None:
            await self._begin(view, "snapshot", "Suspending",
                              Ready=(False, "Suspending", f"{idle_for(after)}; taking a snapshot to suspend"))
            await faults.pause("idle:claimed")  # the race tests stop here: claimed, the sandbox still live
            await self._finish_operation(view, res, provider)
        if not view.status.get(IDLE_SUSPENDED):
            await self._record(view, {IDLE_SUSPENDED: True, SUSPENDED_AT: time.time()})
        # Let go before saying so: a Workflow waiting for this Sandbox looks again on its status change.
        if not await self.records.swap_holder(view.namespace, view.uid, IDLE_CLAIM, None):
            log.warning("sandbox %s/%s: the idle suspend's claim was gone when it was let go", view.namespace, view.name)
        return await self._stay_idle_suspended(view, res)

    async def _stay_idle_suspended(self, view: SandboxView, res: SandboxResource) -> float:
        suspended_at = view.status.get(SUSPENDED_AT)
        since = float(suspended_at) if isinstance(suspended_at, int | float) else None
        if view.status.get("phase") != "Suspended":
            latest = view.snapshots[-1] if view.snapshots else None
            message = (f"{idle_for(res.spec.idle_suspend_after_seconds)}: suspended in snapshot {latest}; the next "
                       f"Workflow that uses it (spec.sandboxRef) resumes it")
            await self._transition(view, "Suspended", {"state": SUSPENDED, "stateSince": rfc3339(since)},
                                   Ready=(False, "IdleSuspended", message), Suspended=(True, "IdleTimeout", message))
            await self._emit(view, "IdleSuspended", message)
        await self._show_state(view, plan_idle(after=None, live=False, held=False, last_active=None,
                                               suspended_at=since, now=time.time()))
        # A Workflow taking it wakes this daemon at once (SandboxView.notice); the timer is the backstop for a
        # watch event missed.
        return self.settings.idle_poll

    async def _resumed(self, view: SandboxView, holder: str | None) -> None:
        """The idle-suspended sandbox is live again (restored by ``_keep_live``): say so, for whom."""
        handle = view.handle()
        assert handle is not None
        since = rfc3339(view.status.get(SUSPENDED_AT))
        await self._record(view, {IDLE_SUSPENDED: None})
        source = f" from snapshot {view.snapshots[-1]}" if view.snapshots else ""
        why = f"for Workflow {holder}" if holder else "(spec.idleSuspendAfterSeconds was removed)"
        await self._emit(view, "Resumed", f"sandbox {handle.id} resumed{source} {why}; it was suspended for idleness "
                                          f"since {since}")

    async def _drop_idle_claim(self, view: SandboxView) -> None:
        """spec.suspend wins: an idle suspend it interrupted lets go (its operation was finished first)."""
        if (await self.records.read(view.namespace, view.uid)).get(HOLDER) == IDLE_CLAIM:
            await self.records.swap_holder(view.namespace, view.uid, IDLE_CLAIM, None)
