"""The kubernetes provider's sandboxes over time: leases (an annotation, renewed; a Pod past it is deleted when
next touched and by every listing), loss (what a failed exec means), destroy and loss injection, and the
listings by owner and installation (only the operator's sealed Pods)."""

from __future__ import annotations

import logging
from typing import Any

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    SandboxGone,
    SandboxHandle,
    tag_key,
)
from durable_sandbox.providers.kubernetes_adoption import PodAdoption
from durable_sandbox.providers.kubernetes_connection import (
    INSTALLATION_KEY_LABEL,
    LEASE_ANNOTATION,
    SANDBOX_LABEL,
    api_body,
    lease_seconds_of,
    split_id,
    terminated_message,
)
from durable_sandbox.providers.kubernetes_exec import ExecRejected
from durable_sandbox.providers.kubernetes_identity import identify
from durable_sandbox.providers.kubernetes_pool import OWNER_KEY_LABEL

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["PodLifecycle"]


class PodLifecycle(PodAdoption):
    """Leases, loss, destroy, and listing the operator's sandbox Pods."""

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        namespace, name = split_id(handle.id)
        await self._require_live(handle)
        core = await self._api()
        expires = self._clock() + seconds
        try:
            pod = await api_body(core.patch_namespaced_pod_without_preload_content(
                name, namespace, {"metadata": {"annotations": {LEASE_ANNOTATION: repr(expires)}}}))
        except Exception as exc:
            if self._status(exc) == 404:
                raise SandboxGone(handle.id, "its Pod no longer exists") from None
            raise self._api_error(f"renew the lease of {handle.id}", exc) from None
        if pod["metadata"].get("deletionTimestamp"):
            raise SandboxGone(handle.id, "its Pod is being deleted")
        recorded = handle.metadata.get("uid")
        if recorded and pod["metadata"].get("uid") != recorded:
            # Deleted and made again under the same name by someone else: not this sandbox (nor its files).
            await self._refuse(pod, f"it replaced sandbox {handle.id}'s Pod (uid {recorded}) under the same name")
            self._gone[handle.id] = "its Pod was replaced by another Pod of the same name"
            raise SandboxGone(handle.id, "its Pod was replaced by another Pod of the same name")
        self._leases.granted(handle.id, expires)
        return self._handle(pod)

    async def destroy(self, handle: SandboxHandle) -> None:
        self._gone[handle.id] = "it was destroyed"
        self._leases.forget(handle.id)
        await self._delete_handle(handle)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        """Delete the Pod behind the caller's back, as an eviction would (testing aid). The sandbox is gone when
        this returns, as the contract says, although the Pod may answer for its grace period yet."""
        self._gone[handle.id] = "loss was injected: its Pod was deleted"
        await self._delete_handle(handle)

    async def _require_live(self, handle: SandboxHandle) -> None:
        if handle.id in self._gone:
            raise SandboxGone(handle.id, self._gone[handle.id])
        # (No Pod here: a sandbox this process never leased gets the longest lease from its first sight.)
        if self._leases.ran_out(handle.id, str(handle.metadata.get("uid") or ""), handle.lease_expires_at,
                                lease_seconds_of(None)):
            self._gone[handle.id] = "its lease ran out; the Pod was deleted"
            await self._delete_handle(handle)
            raise SandboxGone(handle.id, "its lease ran out; the Pod was deleted")

    async def _lost(self, handle: SandboxHandle, exc: BaseException) -> BaseException:
        """What a failed exec means: the sandbox is gone (with why) or a transient failure to retry."""
        namespace, name = split_id(handle.id)
        pod = await self._read_pod(namespace, name)
        if pod is None:
            return SandboxGone(handle.id, "its Pod no longer exists")
        if pod["metadata"].get("deletionTimestamp"):
            return SandboxGone(handle.id, "its Pod is being deleted")
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated:
                return SandboxGone(handle.id, terminated_message(namespace, name, terminated))
        if status.get("phase") in ("Failed", "Succeeded"):
            return SandboxGone(handle.id, f"its Pod ended ({status.get('phase')}: {status.get('reason') or ''})".strip())
        if isinstance(exc, ExecRejected) and exc.status == 404:
            return SandboxGone(handle.id, "its Pod no longer exists")
        return exc

    async def _live(self, pods: list[dict[str, Any]]) -> list[SandboxHandle]:
        """Handles of the operator's sealed Pods that are neither terminating nor past their lease (those are
        deleted now, saying so). Pods with a sandbox Pod's labels but not the operator's seal are refused: never
        listed (so never adopted, nor destroyed as an orphan) and never deleted."""
        handles = []
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            identity = identify(pod, self._seal_key)
            if identity.verdict == "foreign":
                await self._refuse(pod, f"it has a sandbox Pod's labels but {identity.why}")
                continue
            handle = self._handle(pod)
            if self._leases.ran_out(handle.id, str(pod["metadata"].get("uid") or ""), handle.lease_expires_at,
                                    lease_seconds_of(pod)):
                # (An unfinished attempt, marked for this name by the operator, goes too once its lease ran out:
                # its provision died; a retry would have made it again.)
                await self._remove(pod, "its lease ran out (nobody renewed it)")
                continue
            if identity.sealed:  # an unfinished attempt is its provision's to finish: never listed
                handles.append(handle)
        return handles

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        await self._api()
        pods = await self._pods([self._namespace_for(owner)], f"{SANDBOX_LABEL}=true,{OWNER_KEY_LABEL}={tag_key(owner)}")
        # The label holds a digest: the annotation must name exactly this owner (a colliding key is not ours).
        return [h for h in await self._live(pods) if h.metadata.get("owner") == owner]

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        await self._api()
        pods = await self._pods(self._inventory_namespaces(),
                                f"{SANDBOX_LABEL}=true,{INSTALLATION_KEY_LABEL}={tag_key(installation)}")
        return [h for h in await self._live(pods)
                if (h.metadata.get("labels") or {}).get(INSTALLATION_LABEL) == installation]
