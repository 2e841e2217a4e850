"""The kubernetes provider's provisions: the template (the operator's default, a PodTemplate, an image; checked
against the policy), the Pod's name, labels and env Secret, a warm claim or a new Pod, waiting until it runs
(or says why it never will), the probe, the restore, and the seal that makes it the operator's."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    ProviderError,
    ProvisionError,
    SandboxHandle,
    SandboxSpec,
    tag_key,
)
from durable_sandbox.providers.exec_target import ExecTarget
from durable_sandbox.providers.kubernetes_connection import (
    INSTALLATION_KEY_LABEL,
    LEASE_ANNOTATION,
    MANAGED_BY,
    MAXIMUM_LEASE_SECONDS,
    RUN_LABEL,
    SANDBOX_LABEL,
    api_body,
)
from durable_sandbox.providers.kubernetes_identity import (
    META_ANNOTATION,
    SEAL,
    creation_mark,
    env_secret_name,
    identify,
)
from durable_sandbox.providers.kubernetes_pool import (
    OPERATION_KEY_LABEL,
    OWNER_KEY_LABEL,
    TEMPLATE_HASH_LABEL,
    template_hash,
)
from durable_sandbox.providers.kubernetes_startup import wait_running
from durable_sandbox.providers.kubernetes_template import (
    CONTAINER,
    PodTemplate,
    pod_template_reference,
)
from durable_sandbox.providers.kubernetes_warm import WarmClaims

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["PodProvisioning", "pod_name"]

_ENV_SECRET_ATTEMPTS = 3  # a Secret under the env Secret's name deleted, and back again, this many times: give up
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class PodProvisioning(WarmClaims):
    """Provisions: a claimed warm Pod or a new one, made into a sandbox."""

    async def pool_template(self, namespace: str, reference: str) -> PodTemplate:
        """PodTemplate ``reference`` of ``namespace`` as a provision would use it (the policy checked)."""
        return await self._template_for(SandboxSpec(template=f"podtemplate/{reference}"), namespace)

    async def _template_for(self, spec: SandboxSpec, namespace: str) -> PodTemplate:
        reference = pod_template_reference(spec.template)
        if reference is not None:
            core = await self._api()
            try:
                body = await api_body(core.read_namespaced_pod_template_without_preload_content(reference, namespace))
            except Exception as exc:
                if self._status(exc) == 404:
                    raise ProvisionError(f"template {spec.template!r}: there is no PodTemplate {reference} in "
                                         f"namespace {namespace}; create it, or name another", retryable=False) from None
                raise self._api_error(f"read PodTemplate {namespace}/{reference}", exc) from None
            return self.template.from_pod_template(reference, body).check(self.policy, source=f"PodTemplate {reference}")
        template = self.template.with_image(spec.template) if spec.template else self.template
        return template.check(self.policy, source=f"image {spec.template}" if spec.template else "the operator's default")

    def _labels(self, spec: SandboxSpec, operation: str) -> dict[str, str]:
        labels = {**MANAGED_BY, SANDBOX_LABEL: "true", OPERATION_KEY_LABEL: tag_key(operation)}
        if spec.owner is not None:
            labels[OWNER_KEY_LABEL] = tag_key(spec.owner)
        installation = spec.labels.get(INSTALLATION_LABEL)
        if installation is not None:
            labels[INSTALLATION_KEY_LABEL] = tag_key(installation)
        run = spec.labels.get(RUN_LABEL)
        if run is not None and len(run) <= 63 and _LABEL_VALUE.match(run):
            labels[RUN_LABEL] = run
        return labels

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        return await self._provision(spec, lease_seconds)

    async def _provision(self, spec: SandboxSpec, lease_seconds: int,
                         restore: Callable[[SandboxHandle], Any] | None = None) -> SandboxHandle:
        if lease_seconds <= 0 or lease_seconds > MAXIMUM_LEASE_SECONDS:
            raise ProvisionError(f"lease_seconds must be in 1..{MAXIMUM_LEASE_SECONDS}, not {lease_seconds}",
                                 retryable=False)
        core = await self._api()
        namespace = self._namespace_for(spec.owner)
        template = await self._template_for(spec, namespace)
        operation = spec.operation_id or f"random-{secrets.token_hex(12)}"
        name = pod_name(operation)
        sandbox_id = f"{namespace}/{name}"
        expires = self._clock() + lease_seconds
        labels = self._labels(spec, operation)
        if pod_template_reference(spec.template) is not None and self._pool_key is not None:
            labels[TEMPLATE_HASH_LABEL] = template_hash(template)
        # The lease's length is sealed with the rest (identify()): a process that never leased this Pod gives
        # it that long from its first sight before taking it for abandoned (lease_end.py).
        described = json.dumps({"owner": spec.owner, "labels": dict(spec.labels), "template": spec.template,
                                "leaseSeconds": lease_seconds}, sort_keys=True)
        annotations = {LEASE_ANNOTATION: repr(expires), META_ANNOTATION: described}
        env_secret = env_secret_name(self._seal_key, namespace, name) if spec.env else None
        manifest = template.pod(name=name, namespace=namespace, labels=labels, annotations=annotations,
                                env_secret=env_secret)
        self._gone.pop(sandbox_id, None)
        claimed = await self._claim_warm(spec, namespace, template, manifest, finished=restore is None)
        if claimed is not None:
            if restore is None and identify(claimed, self._seal_key).sealed:  # sealed by the claim itself
                self._leases.granted(sandbox_id, expires)
                return self._handle(claimed)
            return await self._finish(claimed, restore, cold=False, expires=expires)
        manifest["metadata"]["annotations"][SEAL] = creation_mark(
            self._seal_key, namespace, name, labels.get(OWNER_KEY_LABEL, ""), labels[OPERATION_KEY_LABEL], described)

        made: list[str] = []  # uids of the env Secrets this provision created (only those it may delete)

        async def put_env() -> None:
            if env_secret is not None:
                # Before the Pod, so its container starts at once (a missing Secret holds it back for the kubelet's
                # retry period). Only a process killed between the two requests leaves the Secret without a Pod;
                # a retried provision of the same operation finds it (same name) and makes it anew.
                made.append(await self._put_env_secret(namespace, env_secret, labels, spec.env))

        try:
            pod, adopted = await self._create_pod(core, manifest, spec, put_env)
        except BaseException:
            if env_secret is not None:
                for uid in made:  # never a Secret of that name someone else made
                    with contextlib.suppress(Exception):
                        await self._delete_env_secret(namespace, env_secret, uid)
            raise
        if not adopted:
            return await self._finish(pod, restore, env_secret=env_secret, cold=True, expires=expires)
        if env_secret is not None:  # made anew above: the adopted Pod owns it, as the first attempt's did
            await self._own_env_secret(namespace, env_secret, pod)
        self._leases.granted(sandbox_id, expires)
        return self._handle(pod)

    async def _finish(self, pod: dict[str, Any], restore: Callable[[SandboxHandle], Any] | None, *, cold: bool,
                      expires: float, env_secret: str | None = None) -> SandboxHandle:
        """Make a new Pod a sandbox: a cold one gets its env Secret, runs and passes the image probe (a claimed
        warm one did all that in the pool); then the restore, then the seal over its uid, which makes it one the
        operator adopts. A Pod that fails on the way is deleted (its uid: never another Pod of its name)."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            if cold:
                if env_secret is not None:
                    await self._own_env_secret(namespace, env_secret, pod)
                try:
                    pod = await wait_running(await self._api(), pod, read=partial(self._read_pod, namespace, name),
                                             ready_timeout=self.ready_timeout,
                                             unschedulable_grace=self.unschedulable_grace)
                except (ProviderError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # the watch request (RBAC: the chart grants watch on pods; the network)
                    raise self._provision_error(f"watch Pod {namespace}/{name} until it runs", exc) from None
                # No Pod reads around this exec: it sends nothing of the sandbox's, and the seal patch below fails
                # unless its answer has the same uid (a uid is never reused), so a namesake's answer is never believed.
                await self._probe(self._handle(pod), unverified=ExecTarget(namespace, name, pod["metadata"]["uid"],
                                                                             CONTAINER))
            if restore is not None:
                await restore(self._handle(pod))
            pod = await self._seal(pod)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._delete(namespace, name, pod["metadata"]["uid"])
            raise
        self._leases.granted(f"{namespace}/{name}", expires)
        return self._handle(pod)

    async def _put_env_secret(self, namespace: str, name: str, labels: dict[str, str],
                              env: Mapping[str, str]) -> str:
        """Create the env Secret; its uid. One already under its name (``env_secret_name``: only the operator
        computes it) is an earlier attempt's, or a copy of it someone made once they saw it: never written into
        (its keys would become the sandbox's env beside ours), but deleted and made anew."""
        core = await self._api()
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace, "labels": labels}, "stringData": dict(env)}
        for _ in range(_ENV_SECRET_ATTEMPTS):
            try:
                created = await api_body(core.create_namespaced_secret_without_preload_content(namespace, body))
                return str(created["metadata"]["uid"])
            except Exception as exc:
                if self._status(exc) != 409:
                    raise self._provision_error(f"create the env Secret {namespace}/{name}", exc) from None
            # (Deleted by name: the operator may not read Secrets back, so it never learns this one's uid.)
            log.info("kubernetes: deleting Secret %s/%s found under the env Secret's name: made anew, never "
                     "reused", namespace, name)
            await self._delete_env_secret(namespace, name, None)
        raise ProvisionError(f"create the env Secret {namespace}/{name}: a Secret of its name came back "
                             f"{_ENV_SECRET_ATTEMPTS} times while it was made anew; find out who makes it",
                             retryable=True)

    async def _delete_env_secret(self, namespace: str, name: str, uid: str | None) -> None:
        core = await self._api()
        try:
            await api_body(core.delete_namespaced_secret_without_preload_content(
                name, namespace, body={"preconditions": {"uid": uid}} if uid else {}), parse=False)
        except Exception as exc:
            if self._status(exc) not in (404, 409):
                raise self._api_error(f"delete Secret {namespace}/{name}", exc) from None

    async def _own_env_secret(self, namespace: str, name: str, pod: dict[str, Any]) -> None:
        """The Pod owns its env Secret, so the cluster deletes the Secret with the Pod, however the Pod goes."""
        core = await self._api()
        owner = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        try:
            await api_body(core.patch_namespaced_secret_without_preload_content(
                name, namespace, {"metadata": {"ownerReferences": [owner]}}), parse=False)
        except Exception as exc:
            raise self._provision_error(f"give the env Secret {namespace}/{name} to its Pod", exc) from None


def pod_name(operation_id: str) -> str:
    return "dsb-" + hashlib.sha256(operation_id.encode()).hexdigest()[:20]
