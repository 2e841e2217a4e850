"""``spec.suspend: true``: snapshot, record it, destroy the live sandbox (deferred while a Workflow holds it; refused
with ``Suspended=False`` by a provider that cannot snapshot)."""

from __future__ import annotations

import time

from durable_sandbox.kube.journal.sandbox_records import IDLE_SUSPENDED, SUSPENDED_AT
from durable_sandbox.kube.sandbox.idle import SUSPENDED
from durable_sandbox.kube.sandbox.live import SandboxLive
from durable_sandbox.kube.sandbox.view import SandboxView
from durable_sandbox.kube.spec.conditions import rfc3339
from durable_sandbox.kube.spec.models import SandboxResource
from durable_sandbox.providers.contract import Capability, SandboxProvider

__all__ = ["SandboxSuspend"]


class SandboxSuspend(SandboxLive):
    """Suspending on request."""

    async def _keep_suspended(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        handle = view.handle()
        if handle is not None:
            holder = await self.holding.running_holder(view.namespace, await self.records.read(view.namespace, view.uid))
            if holder is not None:
                # Destroying the sandbox under a running Workflow would fail its calls: wait for it to end.
                message = f"Workflow {holder} holds this sandbox (spec.sandboxRef); it is suspended once that Workflow ends"
                if (self._condition(view, "Suspended") or {}).get("message") != message:
                    await self._transition(view, "Ready", Suspended=(False, "HeldByWorkflow", message))
                    await self._emit(view, "SuspendDeferred", message)
                return self.settings.held_retry
            if not provider.capabilities().supports(Capability.SNAPSHOT):
                message = (f"provider {res.spec.provider} cannot snapshot, so spec.suspend cannot be honoured without "
                           f"losing the workspace; the sandbox stays live. Set spec.suspend to false, or use a provider "
                           f"with the snapshot capability")
                if (self._condition(view, "Suspended") or {}).get("reason") != "SnapshotUnsupported":
                    await self._transition(view, "Ready", Suspended=(False, "SnapshotUnsupported", message))
                    await self._emit(view, "SuspendRefused", message, "Warning")
                return await self._keep_live(view, res, provider)
            await self._begin(view, "snapshot", "Suspending", Ready=(False, "Suspending", "taking a snapshot to suspend"))
            await self._finish_operation(view, res, provider)
        if view.status.get("phase") != "Suspended" or view.status.get(IDLE_SUSPENDED):
            # (An idle-suspended Sandbox is now suspended on request: the next Workflow no longer resumes it.)
            latest = view.snapshots[-1] if view.snapshots else None
            now = time.time()
            await self._record(view, {IDLE_SUSPENDED: None, SUSPENDED_AT: now})
            await self._transition(
                view, "Suspended", {"state": SUSPENDED, "stateSince": rfc3339(now)},
                Ready=(False, "Suspended", "spec.suspend is true; no live sandbox"),
                Suspended=(True, "SuspendRequested", f"suspended in snapshot {latest}" if latest else "suspended before provisioning"),
            )
        return None
