"""``spec.suspend: false``: one live sandbox, its provider lease renewed at half its length; a sandbox the
provider reports gone is a loss (``SandboxLost``), re-created from the newest snapshot (``Recovered``)."""

from __future__ import annotations

import time
from typing import Any

from durable_sandbox.kube.sandbox.base import handle_metadata
from durable_sandbox.kube.sandbox.operations import SandboxOperations
from durable_sandbox.kube.sandbox.view import SandboxView
from durable_sandbox.kube.spec.conditions import rfc3339
from durable_sandbox.kube.spec.models import SandboxResource
from durable_sandbox.providers.contract import SandboxGone, SandboxProvider

__all__ = ["SandboxLive"]


def parse_time(value: Any) -> float | None:
    if not value:
        return None
    import datetime as dt

    try:
        return dt.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


class SandboxLive(SandboxOperations):
    """Keeping the sandbox live, and recovering it when it is lost."""

    async def _keep_live(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        handle = view.handle()
        if handle is None:
            await self._bring_up(view, res, provider, reason="resume" if view.snapshots else "create")
            handle = view.handle()
            assert handle is not None
        lease = res.spec.lease_seconds
        expires = handle.lease_expires_at or parse_time(view.status.get("leaseExpiresAt"))
        now = time.time()
        check, view.check_live = view.check_live, False
        if expires is None or expires - now <= lease / 2 or check:  # renewal is the liveness check
            try:
                handle = await provider.renew_lease(handle, lease)
            except SandboxGone as exc:
                return await self._lost(view, res, provider, str(exc))
            await self._patch(view, {"leaseExpiresAt": rfc3339(handle.lease_expires_at),
                                     "handle": handle_metadata(handle)})
            expires = handle.lease_expires_at
        if view.status.get("phase") != "Ready":
            await self._transition(view, "Ready", Ready=(True, "SandboxReady", f"sandbox {handle.id} is live"),
                                   Suspended=(False, "NotSuspended", ""))
        # Renew at half the lease; look again at least that often (renewal is the liveness check).
        due = (expires - lease / 2 - time.time()) if expires is not None else lease / 2
        return max(1.0, min(due, lease / 2))

    async def _lost(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider, detail: str) -> float:
        lost = view.status.get("providerId")
        newest = await self._newest_snapshot(view)  # its own (a suspend's) or its session calls', taken last
        message = f"sandbox {lost} is gone ({detail}); re-creating it" + (
            f" from snapshot {newest}" if newest else " fresh (no snapshot to restore)")
        await self._transition(view, "Recovering", {"providerId": None, "handle": None, "leaseExpiresAt": None},
                               Ready=(False, "SandboxLost", message))
        await self._emit(view, "SandboxLost", message, "Warning")
        await self._bring_up(view, res, provider, reason="recover")
        handle = view.handle()
        assert handle is not None
        source = f"snapshot {newest}" if newest else "a fresh sandbox"
        await self._emit(view, "Recovered", f"sandbox {lost} recovered into {handle.id} from {source}")
        await self._transition(view, "Ready", Ready=(True, "Recovered", f"sandbox {handle.id} is live (recovered)"))
        return 1.0
