"""The kubernetes provider's side of warm pools (``kubernetes_pool.py`` says what a pool Pod is and how it is
told from a forgery): claiming a warm Pod for a provision with one conditional write, and the Pods the pool's
reconciler (``kube/pool/``) makes, promotes, deletes and refuses."""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from durable_sandbox.providers.contract import SandboxSpec
from durable_sandbox.providers.kubernetes_calls import PodCalls
from durable_sandbox.providers.kubernetes_connection import (
    HOPELESS_WAITING,
    LEASE_ANNOTATION,
    MANAGED_BY,
    SANDBOX_LABEL,
    api_body,
)
from durable_sandbox.providers.kubernetes_identity import (
    META_ANNOTATION,
    SEAL,
    completion_seal,
    identify,
)
from durable_sandbox.providers.kubernetes_pod_match import spec_mismatch
from durable_sandbox.providers.kubernetes_pool import (
    CLAIMED,
    OPERATION_KEY_LABEL,
    OWNER_KEY_LABEL,
    POOL_LABEL,
    POOL_STATE_LABEL,
    SEAL_ANNOTATION,
    STARTING,
    TEMPLATE_HASH_LABEL,
    WARM,
    PoolClaim,
    PoolPod,
    claim_patch,
    creation_seal,
    template_hash,
    warm_seal,
)
from durable_sandbox.providers.kubernetes_template import (
    PodTemplate,
    pod_template_reference,
)

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["WarmClaims"]


class WarmClaims(PodCalls):
    """Warm pool Pods: claimed by provisions, kept by the pool's reconciler."""

    def _observe_pool(self, namespace: str, pool: str, outcome: str, reason: str, started: float) -> None:
        if self._pool_observer is not None:
            with contextlib.suppress(Exception):  # metrics never fail a provision
                self._pool_observer(PoolClaim(namespace, pool, outcome, reason, time.monotonic() - started))

    async def _claim_warm(self, spec: SandboxSpec, namespace: str, template: PodTemplate,
                          manifest: dict[str, Any], *, finished: bool = False) -> dict[str, Any] | None:
        """A warm Pod of this template claimed for this provision (one conditional patch), or None: a miss, and
        the caller makes the Pod (cold). See providers/kubernetes_pool.py for what is trusted and why.
        ``finished``: nothing is left to do to it (no restore), so the same patch seals it over its uid as a
        finished sandbox (``kubernetes_identity.py``): no second request before the first call."""
        started = time.monotonic()
        reference = pod_template_reference(spec.template)
        if reference is None or self._pool_key is None:
            return None  # pools are of PodTemplates, and only an operator with the key trusts pool Pods
        if spec.env:
            # The env is the container's environment (a Secret read when it starts): a running Pod's cannot change.
            self._observe_pool(namespace, reference, "miss", "env", started)
            return None
        thash = template_hash(template)
        labels = manifest["metadata"]["labels"]
        annotations = {k: manifest["metadata"]["annotations"][k] for k in (LEASE_ANNOTATION, META_ANNOTATION)}
        pods = await self._pods([namespace], f"{TEMPLATE_HASH_LABEL}={thash}")
        candidates = []
        for pod in pods:
            meta = pod["metadata"]
            pool = (meta.get("labels") or {}).get(POOL_LABEL)
            if (meta.get("labels") or {}).get(OPERATION_KEY_LABEL) == labels[OPERATION_KEY_LABEL]:
                # This operation's Pod from an earlier attempt (an answer lost, an operator restarted): one claimed
                # and finished (sealed over its uid) is adopted; a cold one is the cold path's to adopt (by name).
                mine = PoolPod.of(pod, self._pool_key, pool) if pool is not None else None
                if mine is None or mine.state != CLAIMED or not mine.sealed or meta.get("deletionTimestamp"):
                    if pool is not None:
                        await self._refuse(pod, f"it has this operation's labels but {identify(pod, self._seal_key).why}")
                    return None
                if identify(pod, self._seal_key).sealed and spec_mismatch(pod, manifest) is None:
                    return pod
                # Claimed by this operation (the claimed seal binds its uid) but never finished (a restore cut
                # short), or changed since: it goes, and this provision claims or makes another.
                await self._remove(pod, "this operation's claimed Pod never finished (or was changed); made again")
                continue
            if pool is None:
                continue
            seen = PoolPod.of(pod, self._pool_key, pool, hopeless=HOPELESS_WAITING)
            if seen.state != WARM or not seen.running or seen.terminating:
                continue
            if not seen.sealed:
                log.warning("kubernetes: Pod %s/%s has pool %s's labels but not the operator's seal; not claimed",
                            namespace, meta["name"], pool)
                continue
            problem = spec_mismatch(pod, manifest)
            if problem is not None:
                await self._refuse(pod, f"warm Pod of pool {pool} is not the template's Pod ({problem}); not claimed")
                continue
            candidates.append((pool, pod))
        # Claimers racing for the same Pods each start at another place, so most win their first try.
        secrets.SystemRandom().shuffle(candidates)
        core = await self._api()
        contended = False
        for pool, pod in candidates:
            meta = pod["metadata"]
            seal = {SEAL: completion_seal(self._seal_key, namespace, meta["name"], meta["uid"], labels.get(OWNER_KEY_LABEL, ""),
                                          labels[OPERATION_KEY_LABEL], annotations[META_ANNOTATION])} if finished else {}
            patch = claim_patch(pod, key=self._pool_key, pool=pool, labels=labels, annotations={**annotations, **seal})
            try:
                won = await api_body(core.patch_namespaced_pod_without_preload_content(pod["metadata"]["name"], namespace,
                                                                                     patch))
            except Exception as exc:
                if self._status(exc) in (404, 409):
                    contended = True  # another claimer won it, or it went: the next one
                    continue
                raise self._provision_error(f"claim warm Pod {namespace}/{pod['metadata']['name']}", exc) from None
            log.info("kubernetes: claimed warm Pod %s/%s of pool %s for operation %s", namespace,
                     won["metadata"]["name"], pool, spec.operation_id)
            self._observe_pool(namespace, pool, "claimed", "", started)
            return won
        self._observe_pool(namespace, reference, "miss", "contended" if contended else "none-ready", started)
        return None

    async def pool_pods(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        """Every Pod carrying pool ``pool``'s label in ``namespace`` (forged ones too: the caller checks seals)."""
        await self._api()
        return await self._pods([namespace], f"{POOL_LABEL}={pool}")

    async def make_pool_pod(self, namespace: str, pool: str, owner: Mapping[str, str], template: PodTemplate) -> str:
        """One new ``starting`` Pod of pool ``pool`` from ``template`` (owned by the pool object ``owner``: its
        apiVersion, kind, name, uid); its name."""
        core = await self._api()
        thash = template_hash(template)
        name = f"dsbp-{secrets.token_hex(10)}"
        labels = {**MANAGED_BY, SANDBOX_LABEL: "true", POOL_LABEL: pool, POOL_STATE_LABEL: STARTING,
                  TEMPLATE_HASH_LABEL: thash}
        assert self._pool_key is not None, "a pool needs the operator's pool key"
        annotations = {SEAL_ANNOTATION: creation_seal(self._pool_key, namespace, name, pool, thash)}
        manifest = template.pod(name=name, namespace=namespace, labels=labels, annotations=annotations, env_secret=None)
        manifest["metadata"]["ownerReferences"] = [{**owner, "blockOwnerDeletion": False}]
        try:
            await api_body(core.create_namespaced_pod_without_preload_content(namespace, manifest), parse=False)
        except Exception as exc:
            raise self._provision_error(f"create warm Pod {namespace}/{name} of pool {pool}", exc) from None
        return name

    async def promote_pool_pod(self, pod: dict[str, Any], pool: str) -> bool:
        """Check a running ``starting`` Pod's image (the probe a cold provision runs) and make it ``warm`` (sealed
        over its uid), conditional on the version read; False when it changed meanwhile or was taken."""
        assert self._pool_key is not None, "a pool needs the operator's pool key"
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        await self._probe(self._handle(pod))
        seal = warm_seal(self._pool_key, namespace, name, meta["uid"], pool, meta["labels"][TEMPLATE_HASH_LABEL])
        core = await self._api()
        try:
            await api_body(core.patch_namespaced_pod_without_preload_content(name, namespace, {"metadata": {
                "resourceVersion": meta["resourceVersion"], "labels": {POOL_STATE_LABEL: WARM},
                "annotations": {SEAL_ANNOTATION: seal}}}), parse=False)
        except Exception as exc:
            if self._status(exc) in (404, 409):
                return False
            raise self._api_error(f"make Pod {namespace}/{name} of pool {pool} warm", exc) from None
        return True

    async def delete_pool_pod(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(namespace, name, uid)

    async def refuse_pool_pod(self, pod: Mapping[str, Any], why: str) -> None:
        """Say that a Pod with a pool's labels is not the pool's (once per Pod: a log line, a Warning Event)."""
        await self._refuse(pod, why)
