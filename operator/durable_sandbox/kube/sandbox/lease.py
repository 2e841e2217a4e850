"""The Sandbox's Lease: one replica reconciles a Sandbox (``dsbx.<uid>``, ``kube/journal/leases.py``); a new holder
reads the status back before it acts, and one that loses the lease stops its reconciliation at once."""

from __future__ import annotations

import logging

from durable_sandbox.kube.api.resources import SANDBOXES
from durable_sandbox.kube.journal.leases import HeldLease, LeaseBusy
from durable_sandbox.kube.sandbox.base import shown_status
from durable_sandbox.kube.sandbox.status import SandboxStatus
from durable_sandbox.kube.sandbox.view import SandboxView

log = logging.getLogger("durable_sandbox.kube.sandbox.controller")

__all__ = ["SandboxLease"]


class SandboxLease(SandboxStatus):
    """Holding the Sandbox's Lease."""

    def _lease_of(self, view: SandboxView) -> HeldLease:
        if view.lease is None:
            view.lease = self._leases.lease(view.namespace, view.name, view.uid, holder=self.settings.worker_id,
                                            ttl=self.settings.lease_ttl, on_lost=lambda: self._lease_lost(view))
        return view.lease

    async def _hold(self, view: SandboxView) -> float | None:
        """None when this replica holds the Sandbox's Lease; else how long until the holder's runs out."""
        lease = self._lease_of(view)
        if lease.held:
            return None
        try:
            epoch = await lease.take()
        except LeaseBusy as busy:
            if view.waiting_on != busy.holder:
                view.waiting_on = busy.holder
                log.info("sandbox %s/%s is reconciled by replica %s; this one waits", view.namespace, view.name,
                         busy.holder)
            return max(1.0, busy.remaining + 0.5)
        view.waiting_on = None
        log.info("sandbox %s/%s: this replica (%s) reconciles it now (lease epoch %d)", view.namespace, view.name,
                 self.settings.worker_id, epoch)
        # The previous holder wrote last: start from what the API server has, not from our memory; what is acted
        # on from the Sandbox's record, only the conditions (for their transition times) from its status.
        obj = await self.objects.get(SANDBOXES, view.namespace, view.name)
        if obj is not None:
            view.status = {**shown_status(obj.get("status")), **await self.records.read(view.namespace, view.uid)}
        return None

    def _lease_lost(self, view: SandboxView) -> None:
        """Another replica may act from now on: stop what this one is doing (as safe as a crash)."""
        if view.turn is not None and not view.turn.done():
            view.turn.cancel()
        view.wake.set()
