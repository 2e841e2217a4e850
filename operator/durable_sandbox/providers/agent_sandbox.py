"""The ``agent-sandbox`` provider: a sandbox is a SandboxClaim of kubernetes-sigs/agent-sandbox (v1.0.1), calls
run in its Pod through the API server's ``pods/exec``, snapshots of its workspace go to object storage through the
S3 API (the thing agent-sandbox's users ask for: upstream #694, #949).

* **A claim** names a SandboxWarmPool (v1.0.1's SandboxClaim has only ``spec.warmPoolRef``: no template ref): the
  one the Workflow's or Sandbox's ``template`` names, else ``DSB_AGENT_SANDBOX_WARM_POOL``. agent-sandbox's
  controller adopts a warm Sandbox of the pool, or makes one from the pool's SandboxTemplate. The claim is made in
  the owner's namespace, named from the provision's operation id (``dsb-<digest>``: a create repeated after a
  lost answer finds it), with ``spec.lifecycle`` ``shutdownTime`` = the lease's end and ``shutdownPolicy:
  Delete``: the operator renews it; nobody renewing it, agent-sandbox's controller deletes it (and its Sandbox
  and Pod). So the claim ends when the operator ends it, from the Workflow's or Sandbox's finalizer (or the
  lease runs out): nothing of agent-sandbox's own ends it earlier unless someone deletes it.
* **Identity** is what the provider recorded: the claim's name and uid, then the uid of the Pod its Sandbox names
  once it is Ready (``agent_sandbox_binding.py``), sealed on the claim under the operator's key (over claim uid,
  Pod uid and container: ``agent_sandbox_claims.claim_identity``), never a label. Every exec follows the chain
  claim -> Sandbox -> Pod and runs only in the recorded Pod (uid read before and after: the ``ExecTargets`` hook);
  a claim deleted (by hand too), re-made, expired (``ClaimExpired``), a Sandbox or Pod gone or replaced is
  :class:`SandboxGone`: the run's recovery restores the last snapshot into a new claim and replays.
* **Calls and snapshots** are the kubernetes provider's (``kubernetes_calls.py``, ``kubernetes_snapshots.py``),
  only their exec target differs. The workspace is ``DSB_AGENT_SANDBOX_WORKSPACE`` (default ``/workspace``, made
  if missing) in the Pod's first container (or ``DSB_AGENT_SANDBOX_CONTAINER``); the template's image needs a POSIX
  shell and tar (the image check says what is missing).
* **What it cannot do** (its capabilities say so): suspend/resume (agent-sandbox's ``operatingMode: Suspended``
  deletes the Pod and keeps only PersistentVolumes; a sandbox is resumed here by snapshot + restore instead), a
  sandbox env (``spec.env`` would be written in plain text into the claim's spec and the Pod's: refused, use a
  call's env), deduplicated creates.

Layers: ``agent_sandbox_objects.py`` (its objects through the API), ``agent_sandbox_claims.py`` (records, chains,
exec targets, loss), ``agent_sandbox_lifecycle.py`` (create, bind, seal, lease, delete, listings); this module:
configuration, capabilities, provision and restore; ``agent_sandbox_user_claims.py``: a run on a claim a user made
(``template: sandboxclaim/<name>``), bound once, never written.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from durable_sandbox.providers import kubernetes_scripts as scripts
from durable_sandbox.providers.agent_sandbox_binding import ClaimRecord
from durable_sandbox.providers.agent_sandbox_claims import CLAIM_UID, rfc3339
from durable_sandbox.providers.agent_sandbox_objects import ClaimObjects
from durable_sandbox.providers.agent_sandbox_settings import AgentSandboxSettings, warm_pool_name
from durable_sandbox.providers.agent_sandbox_user_claims import UserClaims, user_claim_name
from durable_sandbox.providers.archive_limit import configured_limit
from durable_sandbox.providers.contract import (
    TOOL_TYPES,
    Capability,
    ConfigurationError,
    ProviderCapabilities,
    ProvisionError,
    SandboxHandle,
    SandboxSpec,
)
from durable_sandbox.providers.kubernetes_connection import MANAGED_BY, MAXIMUM_LEASE_SECONDS
from durable_sandbox.providers.kubernetes_identity import META_ANNOTATION, SEAL, creation_mark
from durable_sandbox.providers.kubernetes_policy import TemplatePolicy
from durable_sandbox.providers.kubernetes_pool import OPERATION_KEY_LABEL, OWNER_KEY_LABEL
from durable_sandbox.providers.kubernetes_provisioning import pod_name
from durable_sandbox.providers.kubernetes_template import PodTemplate
from durable_sandbox.providers.s3_snapshots import S3Config, S3SnapshotStore

__all__ = ["ENV_ENABLED", "ENV_SNAPSHOT_LIMIT", "AgentSandboxProvider"]

ENV_SNAPSHOT_LIMIT = "DSB_AGENT_SANDBOX_SNAPSHOT_LIMIT"  # the largest snapshot archive (default 1Gi)
_DEFAULT_SNAPSHOT_LIMIT = "1Gi"
ENV_ENABLED = "DSB_AGENT_SANDBOX_ENABLED"  # true: agent-sandbox is installed and the operator may use its claims
_EXTENSIONS_API = "extensions.agents.x-k8s.io/v1beta1"


class AgentSandboxProvider(UserClaims):
    """The provider: configuration, capabilities, provision and restore (see the module docstring)."""

    name = "agent-sandbox"

    def __init__(self, *, settings: AgentSandboxSettings | None = None, namespace: str | None = None,
                 namespaces: list[str] | None = None, kubeconfig: str | None = None, context: str | None = None,
                 store: S3SnapshotStore | S3Config | None = None, environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time, pool_key: bytes | None = None) -> None:
        env = os.environ if environ is None else environ
        super().__init__(namespace=namespace, namespaces=namespaces, kubeconfig=kubeconfig, context=context,
                         template=PodTemplate(), policy=TemplatePolicy(), store=store, environ=env, clock=clock,
                         pool_key=pool_key, snapshot_limit=configured_limit(
                             env, ENV_SNAPSHOT_LIMIT, _DEFAULT_SNAPSHOT_LIMIT, "the default snapshot limit"))
        self.settings = settings if settings is not None else AgentSandboxSettings.from_environ(env)
        self.workspace = self.settings.workspace
        self.ready_timeout = self.settings.ready_timeout
        self._claims: ClaimObjects | None = None

    def __repr__(self) -> str:
        return f"AgentSandboxProvider(namespace={self._namespace!r}, store={self.store!r})"

    @classmethod
    def configuration_problems(cls, environ: Mapping[str, str]) -> list[str]:
        if (environ.get(ENV_ENABLED) or "").strip().lower() not in ("1", "true", "yes"):
            # Off unless asked for: without agent-sandbox's CRDs and the operator's rights on its claims, every
            # run naming it would fail late, and every orphan sweep would fail listing claims.
            return [f"Sandbox provider [agent-sandbox] is not enabled in this operator: set {ENV_ENABLED}=true where "
                    f"kubernetes-sigs/agent-sandbox is installed and the operator may manage its SandboxClaims "
                    f"(docs/providers.md, agent-sandbox)"]
        problems = []
        try:
            AgentSandboxSettings.from_environ(environ)
            configured_limit(environ, ENV_SNAPSHOT_LIMIT, _DEFAULT_SNAPSHOT_LIMIT, "the default snapshot limit")
        except ConfigurationError as exc:
            problems.append(str(exc))
        if environ.get("DSB_S3_BUCKET") or environ.get("DSB_S3_ENDPOINT"):
            problems += S3Config.environ_problems(environ)
        return problems

    def capabilities(self) -> ProviderCapabilities:
        # Not SUSPEND/RESUME: agent-sandbox's Suspended mode deletes the Pod (its workspace unless on a PVC); a
        # session hibernates by snapshot + release and comes back by restore, which it does without them.
        supported = {Capability.LEASE_RECONCILIATION, Capability.INVENTORY, Capability.LOSS_INJECTION,
                     Capability.PROCESS_RESET}
        if self.store is not None:
            supported |= {Capability.SNAPSHOT, Capability.SNAPSHOT_DELETION, Capability.SNAPSHOT_RECONCILIATION,
                          Capability.RESTORE}
        return ProviderCapabilities(supported=frozenset(supported), delivery_guarantee="at_least_once_effects",
                                    idempotent_destroy=True, maximum_lease_seconds=MAXIMUM_LEASE_SECONDS,
                                    tool_types=TOOL_TYPES)

    def _warm_pool(self, spec: SandboxSpec) -> str:
        chosen = spec.template or self.settings.warm_pool
        if chosen is None:
            raise ProvisionError("provider agent-sandbox: no SandboxWarmPool named: set the Workflow's or Sandbox's "
                                 "template to a SandboxWarmPool of its namespace, or the operator's "
                                 "DSB_AGENT_SANDBOX_WARM_POOL", retryable=False)
        try:
            return warm_pool_name(chosen)
        except ValueError as exc:
            raise ProvisionError(f"provider agent-sandbox: the template {exc}", retryable=False) from None

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        return await self._provision(spec, lease_seconds)

    async def _provision(self, spec: SandboxSpec, lease_seconds: int,
                         restore: Callable[[SandboxHandle], Any] | None = None) -> SandboxHandle:
        if lease_seconds <= 0 or lease_seconds > MAXIMUM_LEASE_SECONDS:
            raise ProvisionError(f"lease_seconds must be in 1..{MAXIMUM_LEASE_SECONDS}, not {lease_seconds}",
                                 retryable=False)
        if spec.env:
            raise ProvisionError("provider agent-sandbox cannot give a sandbox env (spec.env): agent-sandbox v1.0.1 "
                                 "would write the values in plain text into the SandboxClaim's and the Pod's spec; "
                                 "pass them in a call's env instead, or use the kubernetes provider", retryable=False)
        user_claim = user_claim_name(spec.template)
        if user_claim is not None:  # a claim the user made (agent_sandbox_user_claims.py)
            return await self._attach_user_claim(spec, user_claim, lease_seconds, restore is not None)
        pool = self._warm_pool(spec)
        namespace = self._namespace_for(spec.owner)
        operation = spec.operation_id or f"random-{secrets.token_hex(12)}"
        name = pod_name(operation)
        expires = self._clock() + lease_seconds
        manifest = self._manifest(spec, namespace, name, operation, pool, expires)
        self._gone.pop(f"{namespace}/{name}", None)
        claim, adopted = await self._create_claim(manifest, operation)
        if adopted:
            handle = self._claim_handle(claim)
            self._leases.granted(handle.id, expires)  # never the claim's written end: anyone may edit it
            return handle
        try:
            return await self._finish_claim(claim, restore, expires)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._delete_claim_uid(namespace, name, claim["metadata"]["uid"])
            raise

    def _manifest(self, spec: SandboxSpec, namespace: str, name: str, operation: str, pool: str,
                  expires: float) -> dict[str, Any]:
        labels = self._labels(spec, operation)
        described = json.dumps({"owner": spec.owner, "labels": dict(spec.labels), "template": spec.template},
                               sort_keys=True)
        mark = creation_mark(self._seal_key, namespace, name, labels.get(OWNER_KEY_LABEL, ""),
                             labels[OPERATION_KEY_LABEL], described)
        return {"apiVersion": _EXTENSIONS_API, "kind": "SandboxClaim",
                "metadata": {"name": name, "namespace": namespace, "labels": {**MANAGED_BY, **labels},
                             "annotations": {META_ANNOTATION: described, SEAL: mark}},
                "spec": {"warmPoolRef": {"name": pool},
                         "lifecycle": {"shutdownTime": rfc3339(expires), "shutdownPolicy": "Delete"}}}

    async def _finish_claim(self, claim: dict[str, Any], restore: Callable[[SandboxHandle], Any] | None,
                      expires: float) -> SandboxHandle:
        """A new claim made a sandbox: bound, its Pod's uid recorded, the workspace made and the image checked, the
        restore, then the seal (only a sealed claim is adopted or listed)."""
        meta = claim["metadata"]
        record = ClaimRecord(namespace=meta["namespace"], claim=meta["name"], claim_uid=meta["uid"])
        binding, pod = await self._wait_bound(record)
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = self.settings.container or (containers[0] if containers else None)
        if not container or container not in containers:
            raise ProvisionError(f"SandboxClaim {record.sandbox_id}: its Pod {binding.name} has no container "
                                 f"{container!r} (it has {containers}); set DSB_AGENT_SANDBOX_CONTAINER",
                                 retryable=False)
        described = self._claim_handle(claim)
        handle = described.model_copy(update={"lease_expires_at": expires, "metadata": {
            **described.metadata, CLAIM_UID: meta["uid"], "uid": binding.uid, "container": container}})
        await self._probe(handle, prefix=scripts.make_workspace(self.workspace))  # one exec: the mkdir, the check
        if restore is not None:
            await restore(handle)
        await self._seal_claim(claim, binding.uid, container)
        self._leases.granted(handle.id, expires)
        return handle
