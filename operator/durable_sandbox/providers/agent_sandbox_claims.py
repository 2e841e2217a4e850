"""The ``agent-sandbox`` provider's sandboxes as the provider recorded them: a SandboxClaim's name and uid, its
Pod's uid, the container calls run in (the handle's metadata; sealed on the claim, ``claim_identity``), and the
Pod an exec goes to, found by following the claim's chain and verified by those uids (``agent_sandbox_binding.py``,
the ``ExecTargets`` hook of ``exec_target.py``) before and after every exec. What a failed exec means (the claim
deleted, expired or re-made, its Pod gone or replaced: :class:`SandboxGone`) and the lease, as with Pods."""

from __future__ import annotations

import datetime
import logging
from typing import Any

from durable_sandbox.providers.agent_sandbox_binding import (
    POD_NAME_ANNOTATION,
    ClaimRecord,
    NotReadyYet,
    PodBinding,
    bind_pod,
)
from durable_sandbox.providers.agent_sandbox_objects import (
    CLAIMS,
    SANDBOXES,
    AgentSandboxObjects,
    ClaimObjects,
)
from durable_sandbox.providers.agent_sandbox_settings import AgentSandboxSettings
from durable_sandbox.providers.contract import ProviderError, SandboxGone, SandboxHandle
from durable_sandbox.providers.exec_target import ExecTarget
from durable_sandbox.providers.kubernetes_connection import (
    MAXIMUM_LEASE_SECONDS,
    split_id,
    terminated_message,
)
from durable_sandbox.providers.kubernetes_exec import ExecRejected
from durable_sandbox.providers.kubernetes_identity import META_ANNOTATION, Identity, identify
from durable_sandbox.providers.kubernetes_snapshots import PodSnapshots

log = logging.getLogger("durable_sandbox.providers.agent_sandbox")

__all__ = ["CLAIM_UID", "CONTAINER_ANNOTATION", "POD_UID_ANNOTATION", "ClaimSandboxes", "claim_identity",
           "lease_of", "rfc3339"]

CLAIM_UID = "claimUid"  # a handle's metadata: the recorded claim's uid ("uid" is its Pod's, as for Pods)
POD_UID_ANNOTATION = "durable-sandbox.dev/pod-uid"  # on a sealed claim: the Pod it was bound to
CONTAINER_ANNOTATION = "durable-sandbox.dev/container"  # on a sealed claim: the container calls run in


def claim_identity(claim: dict[str, Any], key: bytes) -> Identity:
    """The operator's verdict on a claim (``kubernetes_identity.identify``): its seal is over the claim's uid, the
    Pod's uid and the container together, so a claim re-made, re-bound or re-pointed under its name is not sealed."""
    meta = claim.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    bound = f"{meta.get('uid', '')}/{annotations.get(POD_UID_ANNOTATION, '')}/{annotations.get(CONTAINER_ANNOTATION, '')}"
    return identify({**claim, "metadata": {**meta, "uid": bound}}, key)


def rfc3339(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def lease_of(claim: dict[str, Any]) -> float | None:
    """When the claim's lease runs out: its ``spec.lifecycle.shutdownTime`` (agent-sandbox's controller deletes the
    claim then), None without one."""
    raw = ((claim.get("spec") or {}).get("lifecycle") or {}).get("shutdownTime")
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class ClaimSandboxes(PodSnapshots):
    """Records, chains and exec targets of claims (the calls and snapshots are the kubernetes provider's)."""

    settings: AgentSandboxSettings
    _claims: ClaimObjects | None

    async def _objects(self) -> ClaimObjects:
        await self._api()
        if self._claims is None:
            self._claims = AgentSandboxObjects(self._api_client)
        return self._claims

    async def aclose(self) -> None:
        self._claims = None
        await super().aclose()

    def _record(self, handle: SandboxHandle) -> ClaimRecord:
        namespace, claim = split_id(handle.id)
        claim_uid, pod_uid = handle.metadata.get(CLAIM_UID), handle.metadata.get("uid")
        if not isinstance(claim_uid, str) or not claim_uid or not isinstance(pod_uid, str) or not pod_uid:
            raise SandboxGone(handle.id, "its handle records no SandboxClaim and Pod uid: not an agent-sandbox handle")
        return ClaimRecord(namespace=namespace, claim=claim, claim_uid=claim_uid, pod_uid=pod_uid)

    async def _read(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        objects = await self._objects()
        try:
            return await objects.get(plural, namespace, name)
        except Exception as exc:
            raise self._api_error(f"read {plural[:-1]} {namespace}/{name}", exc) from None

    async def _chain(self, record: ClaimRecord) -> tuple[PodBinding, dict[str, Any]]:
        """The Pod ``record``'s claim is bound to now (and the Pod as read); :class:`SandboxGone` when the chain
        does not lead to the recorded Pod, :class:`NotReadyYet` while it is not bound (before the first binding)."""
        claim = await self._read(CLAIMS, record.namespace, record.claim)
        sandbox = pod = None
        sandbox_name = (((claim or {}).get("status") or {}).get("sandbox") or {}).get("name")
        if claim is not None and claim["metadata"].get("deletionTimestamp"):
            raise SandboxGone(record.sandbox_id, f"its SandboxClaim {record.claim} is being deleted")
        if claim is not None and sandbox_name:
            sandbox = await self._read(SANDBOXES, record.namespace, str(sandbox_name))
            if sandbox is not None:
                annotations = sandbox["metadata"].get("annotations") or {}
                pod = await self._read_pod(record.namespace, str(annotations.get(POD_NAME_ANNOTATION) or sandbox_name))
        binding = bind_pod(record, claim, sandbox, pod)
        assert pod is not None
        return binding, pod

    async def _exec_target(self, handle: SandboxHandle, what: str) -> ExecTarget:
        if handle.id in self._gone:
            raise SandboxGone(handle.id, self._gone[handle.id])
        record = self._record(handle)
        try:
            binding, pod = await self._chain(record)
        except NotReadyYet as exc:  # (a recorded Pod uid: bind_pod says gone, not "not yet")
            raise SandboxGone(handle.id, str(exc)) from None
        if pod["metadata"].get("deletionTimestamp"):
            raise SandboxGone(handle.id, f"its Pod {binding.name} is being deleted ({what} not run)")
        return ExecTarget(namespace=record.namespace, pod=binding.name, uid=binding.uid,
                          container=str(handle.metadata.get("container") or ""))

    async def _confirm_target(self, handle: SandboxHandle, target: ExecTarget, what: str) -> None:
        pod = await self._read_pod(target.namespace, target.pod)
        if pod is None or pod["metadata"].get("uid") != target.uid:
            raise SandboxGone(handle.id, f"its Pod {target.pod} was deleted or replaced while {what} ran (its "
                                         f"result is not used)")

    async def _lost(self, handle: SandboxHandle, exc: BaseException) -> BaseException:
        """What a failed exec means: the sandbox gone (with why) or a transient failure to retry."""
        try:
            binding, pod = await self._chain(self._record(handle))
        except (SandboxGone, NotReadyYet) as gone:
            return gone if isinstance(gone, SandboxGone) else SandboxGone(handle.id, str(gone))
        if pod["metadata"].get("deletionTimestamp"):
            return SandboxGone(handle.id, f"its Pod {binding.name} is being deleted")
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated and cs.get("name") in (None, handle.metadata.get("container")):
                return SandboxGone(handle.id, terminated_message(pod["metadata"]["namespace"], binding.name, terminated))
        if status.get("phase") in ("Failed", "Succeeded"):
            return SandboxGone(handle.id, f"its Pod {binding.name} ended ({status.get('phase')})")
        if isinstance(exc, ExecRejected) and exc.status == 404:
            return SandboxGone(handle.id, f"its Pod {binding.name} no longer exists")
        return exc

    async def _require_live(self, handle: SandboxHandle) -> None:
        if handle.id in self._gone:
            raise SandboxGone(handle.id, self._gone[handle.id])
        if self._leases.ran_out(handle.id, str(handle.metadata.get(CLAIM_UID) or ""), handle.lease_expires_at,
                                MAXIMUM_LEASE_SECONDS):
            self._gone[handle.id] = "its lease ran out; its SandboxClaim was deleted"
            await self._delete_claim(handle)
            raise SandboxGone(handle.id, self._gone[handle.id])

    async def _delete_claim(self, handle: SandboxHandle) -> None:
        """Delete the recorded claim (by its uid: never a namesake); agent-sandbox's owner references take its
        Sandbox and Pod along."""
        namespace, name = split_id(handle.id)
        claim_uid = handle.metadata.get(CLAIM_UID)
        if not isinstance(claim_uid, str) or not claim_uid:
            raise ProviderError(f"sandbox {handle.id}: its handle records no SandboxClaim uid; nothing was deleted")
        await self._delete_claim_uid(namespace, name, claim_uid)

    async def _delete_claim_uid(self, namespace: str, name: str, uid: str) -> None:
        objects = await self._objects()
        try:
            await objects.delete(CLAIMS, namespace, name, uid=uid)
        except Exception as exc:
            raise self._api_error(f"delete SandboxClaim {namespace}/{name}", exc) from None

    def _claim_handle(self, claim: dict[str, Any]) -> SandboxHandle:
        """The handle of a sealed claim (its recorded uids and container are on it, under the seal)."""
        import json

        meta = claim["metadata"]
        annotations = meta.get("annotations") or {}
        try:
            described = json.loads(annotations.get(META_ANNOTATION) or "{}")
        except ValueError:
            described = {}
        metadata: dict[str, Any] = {
            "namespace": meta["namespace"], "claim": meta["name"], CLAIM_UID: meta.get("uid"),
            "uid": annotations.get(POD_UID_ANNOTATION), "container": annotations.get(CONTAINER_ANNOTATION),
            "warmPool": ((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name"),
            "owner": described.get("owner"), "labels": dict(described.get("labels") or {})}
        return SandboxHandle(id=f"{meta['namespace']}/{meta['name']}", provider=self.name, metadata=metadata,
                             lease_expires_at=lease_of(claim))
