"""Deletion, behind the ``durable-sandbox.dev/cleanup`` finalizer: the live sandbox and every owned snapshot are
destroyed (``CleanupPending`` while a Workflow holds the Sandbox or the provider refuses)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from durable_sandbox.kube.api.errors import CleanupPending
from durable_sandbox.kube.sandbox.checkpoints import delete_session_snapshots
from durable_sandbox.kube.sandbox.turn import SandboxTurn
from durable_sandbox.kube.sandbox.view import SandboxView, calls_run_id
from durable_sandbox.providers.contract import (
    Capability,
    ProviderError,
    SandboxGone,
    SandboxProvider,
    UnsupportedCapability,
)

__all__ = ["SandboxFinalizer"]


class SandboxFinalizer(SandboxTurn):
    """A Sandbox's cleanup."""

    async def cleanup(self, body: Mapping[str, Any], attempt: int = 0) -> None:
        """Destroy the live sandbox and every owned snapshot; :class:`CleanupPending` while the provider refuses."""
        view = self._view(body)
        view.generation = body["metadata"].get("generation")
        delay = self.settings.cleanup_backoff[min(attempt, len(self.settings.cleanup_backoff) - 1)]
        async with view.lock:
            busy = await self._hold(view)
            if busy is not None:
                self._views.pop(view.uid, None)  # the holder cleans up; nothing of this view is worth keeping
                raise CleanupPending(f"replica {view.waiting_on} reconciles this Sandbox; its cleanup runs there (or "
                                     f"here once that replica's lease runs out)", busy)
            holder = await self.holding.running_holder(view.namespace, await self.records.read(view.namespace, view.uid))
            if holder is not None:
                message = (f"Workflow {holder} holds this sandbox (spec.sandboxRef); deletion waits until it finishes "
                           f"or is cancelled")
                if (self._condition(view, "CleanupBlocked") or {}).get("message") != message:
                    await self._transition(view, "Deleting", CleanupBlocked=(True, "HeldByWorkflow", message))
                    await self._emit(view, "CleanupBlocked", message, "Warning")
                raise CleanupPending(message, self.settings.held_retry)
            try:
                name = view.provider_name
                if name is not None:  # None: no provider was ever pinned or named, so nothing was made
                    await self._destroy_everything(view, self.provider(name))
            except (ProviderError, OSError) as exc:
                if isinstance(exc, UnsupportedCapability):
                    raise
                message = f"deleting the provider's sandbox or snapshots failed: {type(exc).__name__}: {exc}; retrying in {delay:g}s"
                await self._transition(view, "Deleting", CleanupBlocked=(True, "ProviderRefused", message))
                await self._emit(view, "CleanupBlocked", message, "Warning")
                raise CleanupPending(message, delay) from None
            if self._condition(view, "CleanupBlocked") is not None:
                await self._transition(view, "Deleting", CleanupBlocked=(False, "CleanupDone", ""))
            await self.forget_calls(view)
            await self._emit(view, "CleanupDone", "sandbox and snapshots deleted")
            # The Lease goes with the Sandbox (owner reference); nothing is left to reconcile.
            self._views.pop(view.uid, None)
            if view.lease is not None:
                await view.lease.forget()

    async def forget_calls(self, view: SandboxView) -> None:
        """The Sandbox's own call journal goes with it. The API server's Journal objects are owned by the Sandbox
        (the garbage collector deletes them); a PostgreSQL journal has no owner reference: deleted here, as a
        Workflow's run is by its cleanup."""
        if self.journals is not None and not self.journals.collected_with_workflow:
            await self.journals.store_for(view.namespace).delete_run(calls_run_id(view.uid))

    async def _destroy_everything(self, view: SandboxView, provider: SandboxProvider) -> None:
        handle = view.handle()
        op = view.status.get("operation")
        caps = provider.capabilities()
        if handle is not None and op and op["kind"] == "snapshot" and caps.supports(Capability.SNAPSHOT_RECONCILIATION):
            # A suspend was interrupted: its snapshot may exist unrecorded; the same operation id finds it.
            with contextlib.suppress(SandboxGone):
                taken = await provider.snapshot(handle, operation_id=op["id"])
                await self._patch(view, {"snapshots": [*view.snapshots, taken]})
        if handle is not None:
            await provider.destroy(handle)
            await self._patch(view, {"providerId": None, "handle": None, "leaseExpiresAt": None})
        if caps.supports(Capability.LEASE_RECONCILIATION):
            for orphan in await provider.list_sandboxes(view.owner):  # e.g. made by an interrupted provision
                await provider.destroy(orphan)
        for snapshot_id in view.snapshots:
            await provider.delete_snapshot(snapshot_id)
            await self._patch(view, {"snapshots": [s for s in view.snapshots if s != snapshot_id]})
        # The session calls' snapshots (spec.snapshotEveryNCalls, a fork's copy) are journaled with the calls,
        # which go next.
        await delete_session_snapshots(self.journals, view.namespace, view.uid, provider)
        await self._patch(view, {"operation": None})
