"""The kubernetes provider acting on Pod identity (``kubernetes_identity.py``): create a Pod or adopt the finished
one of an earlier attempt under its name, seal a finished Pod over its uid, delete the operator's own Pods by
uid, and refuse, visibly, every Pod it did not make."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from durable_sandbox.providers.contract import (
    ProvisionError,
    SandboxHandle,
    SandboxSpec,
)
from durable_sandbox.providers.kubernetes_connection import (
    KubernetesConnection,
    api_body,
    split_id,
)
from durable_sandbox.providers.kubernetes_identity import (
    META_ANNOTATION,
    SEAL,
    completion_seal,
    identify,
)
from durable_sandbox.providers.kubernetes_pod_match import spec_mismatch
from durable_sandbox.providers.kubernetes_pool import (
    OPERATION_KEY_LABEL,
    OWNER_KEY_LABEL,
)
from durable_sandbox.providers.kubernetes_removal import delete_pod, pod_event

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["PodAdoption"]


class PodAdoption(KubernetesConnection):
    """Creating, adopting, sealing, refusing and deleting Pods by identity, never by labels."""

    async def _create_pod(self, core: Any, manifest: dict[str, Any], spec: SandboxSpec,
                          before: Callable[[], Any]) -> tuple[dict[str, Any], bool]:
        """The Pod made from ``manifest`` (``before`` runs ahead of each create), and whether it was adopted: the
        finished, sealed Pod of an earlier attempt of this operation (an answer lost, an operator restarted).
        A Pod of this name that the operator did not seal for this operation is never adopted
        (providers/kubernetes_identity.py): an unfinished attempt of its own is deleted and made again; any
        other is refused, saying so, and left alone."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        deadline = time.monotonic() + self.ready_timeout
        while True:
            await before()
            try:
                return await api_body(core.create_namespaced_pod_without_preload_content(namespace, manifest)), False
            except Exception as exc:
                if self._status(exc) != 409:
                    raise self._provision_error(f"create Pod {namespace}/{name}", exc) from None
            existing = await self._read_pod(namespace, name)
            if existing is None:
                continue  # deleted between the two requests: create it again
            if not existing["metadata"].get("deletionTimestamp"):
                adopted = await self._adoptable(existing, manifest, spec)
                if adopted:
                    return existing, True
                continue  # an unfinished or changed attempt of ours was deleted: wait it out, make it again
            if time.monotonic() >= deadline:
                raise ProvisionError(f"Pod {namespace}/{name} from an earlier attempt is still terminating",
                                     retryable=True)
            await asyncio.sleep(0.2)  # the reaped Pod of an earlier attempt still terminating: wait it out

    async def _adoptable(self, existing: dict[str, Any], manifest: dict[str, Any], spec: SandboxSpec) -> bool:
        """Whether ``existing`` (the Pod under this operation's name) is this operation's finished Pod; one of
        ours that is not (unfinished, changed) is deleted (False); anyone else's raises, refused."""
        namespace, name = existing["metadata"]["namespace"], existing["metadata"]["name"]
        identity = identify(existing, self._seal_key)
        keys = (OWNER_KEY_LABEL, OPERATION_KEY_LABEL)
        ours = all((existing["metadata"].get("labels") or {}).get(k) == manifest["metadata"]["labels"].get(k)
                   for k in keys)
        if ours and identity.verdict != "foreign":
            problem = spec_mismatch(existing, manifest) if identity.sealed else None
            if identity.sealed and problem is None:
                log.info("kubernetes: adopting Pod %s/%s made for operation %s", namespace, name, spec.operation_id)
                return True
            await self._remove(existing, f"an earlier attempt of operation {spec.operation_id}'s Pod "
                                         f"{'was changed (' + problem + ')' if problem else 'never finished'}; "
                                         f"made again")
            return False
        why = identity.why if ours else "its labels name another owner or operation"
        await self._refuse(existing, f"it has this sandbox's name but the operator did not make it for operation "
                                     f"{spec.operation_id} ({why})")
        raise ProvisionError(f"Pod {namespace}/{name} exists but is not the operator's ({why}): it is neither used "
                             f"nor deleted. Delete it (kubectl delete pod -n {namespace} {name}) to let the sandbox "
                             f"be made, and find out who created it", retryable=False)

    async def _seal(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Seal a finished sandbox Pod over its uid (providers/kubernetes_identity.py): from now on it is one the
        operator adopts, lists and deletes. The Pod as patched."""
        meta = pod["metadata"]
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        seal = completion_seal(self._seal_key, meta["namespace"], meta["name"], meta["uid"],
                               labels.get(OWNER_KEY_LABEL, ""), labels.get(OPERATION_KEY_LABEL, ""),
                               annotations.get(META_ANNOTATION, ""))
        core = await self._api()
        try:
            sealed = await api_body(core.patch_namespaced_pod_without_preload_content(
                meta["name"], meta["namespace"], {"metadata": {"annotations": {SEAL: seal}}}))
        except Exception as exc:
            raise self._provision_error(f"seal Pod {meta['namespace']}/{meta['name']}", exc) from None
        if sealed["metadata"].get("uid") != meta["uid"]:  # replaced meanwhile: the seal does not fit the new one
            raise ProvisionError(f"Pod {meta['namespace']}/{meta['name']} was replaced by another Pod while it "
                                 f"started", retryable=True)
        return sealed

    async def _refuse(self, pod: Mapping[str, Any], why: str) -> None:
        """Say (once per Pod: a log line and a Warning Event on it) that ``pod`` is not trusted, and why."""
        meta = pod.get("metadata") or {}
        if meta.get("uid") in self._reported:
            return
        self._reported.add(meta.get("uid", ""))
        log.warning("kubernetes: Pod %s/%s refused: %s", meta.get("namespace"), meta.get("name"), why)
        await pod_event(await self._api(), pod, "SandboxPodRefused",
                        f"durable-sandbox did not use, adopt or delete this Pod: {why}", "Warning")

    async def _remove(self, pod: Mapping[str, Any], why: str) -> None:
        """Delete one of the operator's Pods (by its uid), saying so: a log line and an Event on it."""
        meta = pod["metadata"]
        log.info("kubernetes: deleting Pod %s/%s: %s", meta["namespace"], meta["name"], why)
        await pod_event(await self._api(), pod, "SandboxPodDeleted", f"durable-sandbox deleted this Pod: {why}")
        await self._delete(meta["namespace"], meta["name"], meta["uid"])

    async def _delete_handle(self, handle: SandboxHandle) -> None:
        """Delete the Pod of ``handle``: the uid it recorded, or (a handle recorded without one) the Pod of its
        name only if the operator sealed it; anything else under that name is not the sandbox's."""
        namespace, name = split_id(handle.id)
        uid = handle.metadata.get("uid")
        if not isinstance(uid, str) or not uid:
            pod = await self._read_pod(namespace, name)
            if pod is None:
                return
            if not identify(pod, self._seal_key).sealed:
                await self._refuse(pod, f"sandbox {handle.id} is to be deleted, but this Pod of its name is not one "
                                        f"the operator sealed ({identify(pod, self._seal_key).why})")
                return
            uid = pod["metadata"]["uid"]
        await self._delete(namespace, name, uid)

    async def _delete(self, namespace: str, name: str, uid: str) -> None:
        """Delete Pod ``namespace/name`` if it is Pod ``uid``. Its env Secret is owned by that uid (ownerReferences),
        so the cluster's garbage collector deletes it with the Pod, and only then: the operator never deletes a
        Secret by its name (nor reads one to find its owner: it has no ``get`` on Secrets)."""
        core = await self._api()
        try:
            await delete_pod(core, namespace, name, uid)
        except Exception as exc:
            raise self._api_error(f"delete Pod {namespace}/{name}", exc) from None
