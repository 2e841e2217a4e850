"""A run on a SandboxClaim a user made (issue 37, item 3): ``template: sandboxclaim/<name>`` with ``provider:
agent-sandbox``. The claim is the user's: agent-sandbox's controller and the user own it; the operator only runs
calls in its Pod.

* **Bound once.** Only a session's first provision (operation id ``<run>/<session>/provision``, the same on each
  retry of it) binds the claim: the claim's uid and its Pod's uid are recorded in the handle (journaled), as for the
  operator's own claims, and every call checks the chain claim -> Sandbox -> Pod against them
  (``agent_sandbox_binding.py``). A claim deleted, replaced by a namesake (another uid), expired, or its Pod
  replaced is :class:`SandboxGone`.
* **Never re-bound.** After a loss the run's restore (or fresh provision) does not read the claim's name again: a
  namesake may be anyone's. It fails, saying what was lost and what to do (its last snapshot stays in the store).
* **Never written.** The operator does not create, patch (no lease, no seal) or delete a user's claim: its destroy,
  a lease run out and an injected loss only forget it. Unsealed, it is never listed, adopted or swept.
* A claim the operator made (sealed: another run's sandbox) is refused.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from durable_sandbox.providers import kubernetes_scripts as scripts
from durable_sandbox.providers.agent_sandbox_binding import ClaimRecord
from durable_sandbox.providers.agent_sandbox_claims import CLAIM_UID, claim_identity
from durable_sandbox.providers.agent_sandbox_lifecycle import ClaimLifecycle
from durable_sandbox.providers.agent_sandbox_objects import CLAIMS
from durable_sandbox.providers.contract import ProvisionError, SandboxHandle, SandboxSpec

log = logging.getLogger("durable_sandbox.providers.agent_sandbox")

__all__ = ["USER_CLAIM", "USER_CLAIM_PREFIX", "UserClaims", "first_provision", "user_claim_name"]

USER_CLAIM_PREFIX = "sandboxclaim/"
USER_CLAIM = "userClaim"  # a handle's metadata: True for a claim a user made (never patched or deleted)
_FIRST_PROVISION_SUFFIX = "/provision"  # sandboxes/journal.provision_id: a session's first provision
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def user_claim_name(template: str | None) -> str | None:
    """The claim's name when ``template`` names a user's claim (``sandboxclaim/<name>``), else None."""
    if template is None or not template.startswith(USER_CLAIM_PREFIX):
        return None
    return template[len(USER_CLAIM_PREFIX):]


def first_provision(operation_id: str | None) -> bool:
    """Whether ``operation_id`` is a session's first provision (not a restore or a replacement after a loss)."""
    return operation_id is not None and operation_id.endswith(_FIRST_PROVISION_SUFFIX)


def _lost_message(namespace: str, name: str) -> str:
    return (f"SandboxClaim {namespace}/{name} is a user's claim (template sandboxclaim/{name}), which only a "
            f"Workflow's first sandbox binds: this is a later one (after it was lost the operator does not bind "
            f"that name again: a claim made since under it may be anyone's) or a Sandbox resource's, and the "
            f"operator never makes claims in a user's stead. Run the Workflow again on a new claim, or name a "
            f"SandboxWarmPool as the template to have losses recovered by restore + replay")


class UserClaims(ClaimLifecycle):
    """Binding a user's claim once, checking it like the operator's own, and never writing it."""

    async def _attach_user_claim(self, spec: SandboxSpec, name: str, lease_seconds: int,
                                 restoring: bool) -> SandboxHandle:
        namespace = self._namespace_for(spec.owner)
        if not _DNS_NAME.match(name):
            raise ProvisionError(f"template sandboxclaim/{name}: {name!r} is not a SandboxClaim name (lower-case "
                                 f"letters, digits, '-' and '.')", retryable=False)
        if restoring or not first_provision(spec.operation_id):
            raise ProvisionError(_lost_message(namespace, name), retryable=False)
        claim = await self._read(CLAIMS, namespace, name)
        where = f"template sandboxclaim/{name}: SandboxClaim {namespace}/{name}"
        if claim is None:
            raise ProvisionError(f"{where} does not exist; create it (kubectl get sandboxclaims -n {namespace}) or "
                                 f"fix the Workflow's template", retryable=False)
        if claim["metadata"].get("deletionTimestamp"):
            raise ProvisionError(f"{where} is being deleted", retryable=False)
        if claim_identity(claim, self._seal_key).sealed:
            raise ProvisionError(f"{where} was made by the operator for another run: a Workflow may name only a "
                                 f"claim a user made", retryable=False)
        record = ClaimRecord(namespace=namespace, claim=name, claim_uid=str(claim["metadata"]["uid"]))
        binding, pod = await self._wait_bound(record)
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = self.settings.container or (containers[0] if containers else None)
        if not container or container not in containers:
            raise ProvisionError(f"{where}: its Pod {binding.name} has no container {container!r} (it has "
                                 f"{containers}); set DSB_AGENT_SANDBOX_CONTAINER", retryable=False)
        metadata: dict[str, Any] = {
            "namespace": namespace, "claim": name, CLAIM_UID: record.claim_uid, "uid": binding.uid,
            "container": container, "warmPool": ((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name"),
            "owner": spec.owner, "labels": dict(spec.labels), USER_CLAIM: True}
        handle = SandboxHandle(id=record.sandbox_id, provider=self.name, metadata=metadata,
                               lease_expires_at=self._clock() + lease_seconds)
        self._gone.pop(handle.id, None)
        await self._probe(handle, prefix=scripts.make_workspace(self.workspace))  # one exec: the mkdir, the check
        log.info("agent-sandbox: bound the user's SandboxClaim %s (uid %s, Pod uid %s)", handle.id,
                 record.claim_uid, binding.uid)
        return handle

    async def _require_live(self, handle: SandboxHandle) -> None:
        if handle.metadata.get(USER_CLAIM) is True and handle.id not in self._gone:
            # A user's claim carries no lease of ours: its end is the handle's, which the operator recorded.
            expires = max(self._leases.known(handle.id) or 0.0, handle.lease_expires_at or 0.0)
            if expires and self._clock() >= expires:
                self._gone[handle.id] = "its lease ran out (a user's SandboxClaim: released, not deleted)"
        await super()._require_live(handle)

    async def _delete_claim(self, handle: SandboxHandle) -> None:
        if handle.metadata.get(USER_CLAIM) is True:  # the user's: forgotten, never deleted
            log.info("agent-sandbox: SandboxClaim %s is a user's: released, not deleted", handle.id)
            return
        await super()._delete_claim(handle)

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        if handle.metadata.get(USER_CLAIM) is not True:
            return await super().renew_lease(handle, seconds)
        await self._require_live(handle)
        await self._exec_target(handle, "renew the lease")  # the recorded claim and Pod, or SandboxGone
        expires = self._clock() + seconds
        self._leases.granted(handle.id, expires)
        return handle.model_copy(update={"lease_expires_at": expires})

    async def destroy(self, handle: SandboxHandle) -> None:
        if handle.metadata.get(USER_CLAIM) is True:
            self._gone[handle.id] = "it was released (a user's SandboxClaim: not deleted)"
            self._leases.forget(handle.id)
            return
        await super().destroy(handle)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        if handle.metadata.get(USER_CLAIM) is True:
            self._gone[handle.id] = "loss was injected (a user's SandboxClaim: forgotten, not deleted)"
            return
        await super().inject_loss(handle)
