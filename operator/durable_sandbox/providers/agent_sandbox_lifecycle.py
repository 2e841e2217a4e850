"""The ``agent-sandbox`` provider's claims over time: made (or the finished claim of an earlier attempt of the same
operation adopted), waited on until agent-sandbox's controller binds them, sealed over what they were bound to, their
lease (``spec.lifecycle.shutdownTime`` with ``shutdownPolicy: Delete``: agent-sandbox's own controller deletes a
claim nobody renews, even with the operator down) renewed, deleted by uid, and listed: only sealed claims."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from durable_sandbox.providers.agent_sandbox_binding import (
    CLAIM_EXPIRED,
    ClaimRecord,
    NotReadyYet,
    PodBinding,
)
from durable_sandbox.providers.agent_sandbox_claims import (
    CONTAINER_ANNOTATION,
    POD_UID_ANNOTATION,
    ClaimSandboxes,
    claim_identity,
    rfc3339,
)
from durable_sandbox.providers.agent_sandbox_objects import CLAIMS, status_of
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    tag_key,
)
from durable_sandbox.providers.kubernetes_connection import (
    INSTALLATION_KEY_LABEL,
    MAXIMUM_LEASE_SECONDS,
    SANDBOX_LABEL,
)
from durable_sandbox.providers.kubernetes_identity import META_ANNOTATION, SEAL, completion_seal
from durable_sandbox.providers.kubernetes_pool import OPERATION_KEY_LABEL, OWNER_KEY_LABEL

log = logging.getLogger("durable_sandbox.providers.agent_sandbox")

__all__ = ["ClaimLifecycle"]

# Ready=False reasons of agent-sandbox v1.0.1's claim controller that waiting does not mend; a missing pool or
# template only after a grace (its controller's cache may not have seen one made just before the claim).
HOPELESS_CLAIM_REASONS = frozenset({"EnvVarsInjectionRejected", "VolumeClaimTemplatesError", CLAIM_EXPIRED})
MISSING_REASONS = frozenset({"WarmPoolNotFound", "TemplateNotFound"})
MISSING_GRACE_SECONDS = 10.0


class ClaimLifecycle(ClaimSandboxes):
    """Claims made, bound, sealed, renewed, deleted and listed."""

    async def _create_claim(self, manifest: dict[str, Any], operation: str) -> tuple[dict[str, Any], bool]:
        """The claim made from ``manifest``, and whether it was adopted: the sealed claim of an earlier attempt of
        this operation. An unfinished attempt of the operator's is deleted and made again; anyone else's claim
        under the name is refused, saying so, and left alone."""
        objects = await self._objects()
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        deadline = time.monotonic() + self.settings.ready_timeout
        while True:
            try:
                return await objects.create(CLAIMS, namespace, manifest), False
            except Exception as exc:
                if status_of(exc) != 409:
                    raise self._provision_error(f"create SandboxClaim {namespace}/{name}", exc) from None
            existing = await self._read(CLAIMS, namespace, name)
            if existing is None:
                continue
            if not existing["metadata"].get("deletionTimestamp"):
                verdict = claim_identity(existing, self._seal_key)
                labels = existing["metadata"].get("labels") or {}
                ours = all(labels.get(k) == manifest["metadata"]["labels"].get(k)
                           for k in (OWNER_KEY_LABEL, OPERATION_KEY_LABEL))
                if ours and verdict.sealed:
                    log.info("agent-sandbox: adopting SandboxClaim %s/%s of operation %s", namespace, name, operation)
                    return existing, True
                if not ours or verdict.verdict == "foreign":
                    why = verdict.why if ours else "its labels name another owner or operation"
                    raise ProvisionError(
                        f"SandboxClaim {namespace}/{name} exists but is not the operator's ({why}): it is neither used "
                        f"nor deleted. Delete it (kubectl delete sandboxclaim -n {namespace} {name}) to let the "
                        f"sandbox be made, and find out who created it", retryable=False)
                log.info("agent-sandbox: SandboxClaim %s/%s of an earlier attempt never finished: made again",
                         namespace, name)
                await self._delete_claim_uid(namespace, name, existing["metadata"]["uid"])
            if time.monotonic() >= deadline:
                raise ProvisionError(f"SandboxClaim {namespace}/{name} of an earlier attempt is still being deleted",
                                     retryable=True)
            await asyncio.sleep(0.2)

    async def _wait_bound(self, record: ClaimRecord) -> tuple[PodBinding, dict[str, Any]]:
        """Until agent-sandbox's controller has bound the claim to a Ready Pod; a reason that waiting does not mend,
        or the deadline, is a ProvisionError saying what to look at."""
        started = time.monotonic()
        deadline = started + self.settings.ready_timeout
        delay = 0.05
        while True:
            try:
                return await self._chain(record)
            except NotReadyYet as exc:
                claim = await self._read(CLAIMS, record.namespace, record.claim) or {}
                reason, message = _ready_reason(claim)
                if reason in HOPELESS_CLAIM_REASONS or (
                        reason in MISSING_REASONS and time.monotonic() - started >= MISSING_GRACE_SECONDS):
                    raise ProvisionError(f"SandboxClaim {record.sandbox_id}: {reason}: {message}; check the warm "
                                         f"pool the Workflow names (its template) and its SandboxTemplate",
                                         retryable=False) from None
                if time.monotonic() >= deadline:
                    raise ProvisionError(f"{exc} after {self.settings.ready_timeout:g}s; see `kubectl describe "
                                         f"sandboxclaim -n {record.namespace} {record.claim}` and agent-sandbox's "
                                         f"controller log", retryable=True) from None
            except SandboxGone as gone:
                raise ProvisionError(f"SandboxClaim {record.sandbox_id} was lost while it started: {gone}",
                                     retryable=True) from None
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 1.5)

    async def _seal_claim(self, claim: dict[str, Any], pod_uid: str, container: str) -> dict[str, Any]:
        """Seal a bound claim over its uid, its Pod's uid and the container (``claim_identity``): from now on the
        operator adopts, lists and deletes it. The claim as patched (only if still the same uid)."""
        meta = claim["metadata"]
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        seal = completion_seal(self._seal_key, meta["namespace"], meta["name"], f"{meta['uid']}/{pod_uid}/{container}",
                               labels.get(OWNER_KEY_LABEL, ""), labels.get(OPERATION_KEY_LABEL, ""),
                               annotations.get(META_ANNOTATION, ""))
        patch = {"metadata": {"uid": meta["uid"], "annotations": {
            SEAL: seal, POD_UID_ANNOTATION: pod_uid, CONTAINER_ANNOTATION: container}}}
        objects = await self._objects()
        try:
            sealed = await objects.patch(CLAIMS, meta["namespace"], meta["name"], patch)
        except Exception as exc:
            raise self._provision_error(f"seal SandboxClaim {meta['namespace']}/{meta['name']}", exc) from None
        if sealed is None:
            raise ProvisionError(f"SandboxClaim {meta['namespace']}/{meta['name']} was deleted while it started",
                                 retryable=True)
        return sealed

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        await self._require_live(handle)
        record = self._record(handle)
        expires = self._clock() + seconds
        objects = await self._objects()
        patch = {"metadata": {"uid": record.claim_uid}, "spec": {"lifecycle": {"shutdownTime": rfc3339(expires)}}}
        try:
            claim = await objects.patch(CLAIMS, record.namespace, record.claim, patch)
        except Exception as exc:
            if status_of(exc) == 409:  # the uid precondition: another claim holds the name now
                raise SandboxGone(handle.id, f"its SandboxClaim {record.claim} was deleted and made again") from None
            raise self._api_error(f"renew the lease of {handle.id}", exc) from None
        if claim is None:
            raise SandboxGone(handle.id, f"its SandboxClaim {record.claim} was deleted")
        if claim["metadata"].get("deletionTimestamp"):
            raise SandboxGone(handle.id, f"its SandboxClaim {record.claim} is being deleted")
        if _ready_reason(claim)[0] == CLAIM_EXPIRED:
            raise SandboxGone(handle.id, "its SandboxClaim expired (ClaimExpired): agent-sandbox's controller ended it")
        self._leases.granted(handle.id, expires)
        return handle.model_copy(update={"lease_expires_at": expires})

    async def destroy(self, handle: SandboxHandle) -> None:
        self._gone[handle.id] = "it was destroyed"
        self._leases.forget(handle.id)
        await self._delete_claim(handle)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        """Delete the claim behind the caller's back, as a hand would (testing aid)."""
        self._gone[handle.id] = "loss was injected: its SandboxClaim was deleted"
        await self._delete_claim(handle)

    async def _live_claims(self, namespaces: list[str], selector: str) -> list[SandboxHandle]:
        """Handles of the operator's sealed claims, neither being deleted nor past their lease (those are deleted
        now). A claim that is not sealed is never listed, adopted or deleted here."""
        objects = await self._objects()
        handles = []
        for namespace in namespaces:
            try:
                claims = await objects.list(CLAIMS, namespace, selector)
            except Exception as exc:
                if status_of(exc) == 404:  # agent-sandbox's CRDs are not installed: no claim of anyone's
                    continue
                raise self._api_error(f"list the SandboxClaims in namespace {namespace}", exc) from None
            for claim in claims:
                if claim["metadata"].get("deletionTimestamp") or not claim_identity(claim, self._seal_key).sealed:
                    continue
                handle = self._claim_handle(claim)
                # The claim's shutdownTime may only make the end later (lease_end.py): anyone may edit it.
                if self._leases.ran_out(handle.id, str(claim["metadata"].get("uid") or ""), handle.lease_expires_at,
                                        MAXIMUM_LEASE_SECONDS):
                    log.info("agent-sandbox: deleting SandboxClaim %s: its lease ran out", handle.id)
                    await self._delete_claim(handle)
                    continue
                handles.append(handle)
        return handles

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        handles = await self._live_claims([self._namespace_for(owner)],
                                          f"{SANDBOX_LABEL}=true,{OWNER_KEY_LABEL}={tag_key(owner)}")
        return [h for h in handles if h.metadata.get("owner") == owner]

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        handles = await self._live_claims(self._inventory_namespaces(),
                                          f"{SANDBOX_LABEL}=true,{INSTALLATION_KEY_LABEL}={tag_key(installation)}")
        return [h for h in handles if (h.metadata.get("labels") or {}).get(INSTALLATION_LABEL) == installation]


def _ready_reason(claim: dict[str, Any]) -> tuple[str, str]:
    for condition in (claim.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("reason") or ""), str(condition.get("message") or "")
    return "", ""

