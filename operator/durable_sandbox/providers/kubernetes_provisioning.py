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
import time
from collections.abc import Callable, Mapping
from typing import Any

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    ProvisionError,
    SandboxHandle,
    SandboxSpec,
    tag_key,
)
from durable_sandbox.providers.kubernetes_connection import (
    HOPELESS_REASONS,
    INSTALLATION_KEY_LABEL,
    LEASE_ANNOTATION,
    MANAGED_BY,
    MAXIMUM_LEASE_SECONDS,
    RUN_LABEL,
    SANDBOX_LABEL,
    api_body,
    terminated_message,
)
from durable_sandbox.providers.kubernetes_identity import (
    META_ANNOTATION,
    SEAL,
    creation_mark,
)
from durable_sandbox.providers.kubernetes_pool import (
    OPERATION_KEY_LABEL,
    OWNER_KEY_LABEL,
    TEMPLATE_HASH_LABEL,
    template_hash,
)
from durable_sandbox.providers.kubernetes_template import (
    PodTemplate,
    pod_template_reference,
)
from durable_sandbox.providers.kubernetes_warm import WarmClaims

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["PodProvisioning", "pod_name"]

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
        described = json.dumps({"owner": spec.owner, "labels": dict(spec.labels), "template": spec.template},
                               sort_keys=True)
        annotations = {LEASE_ANNOTATION: repr(expires), META_ANNOTATION: described}
        env_secret = f"{name}-env" if spec.env else None
        manifest = template.pod(name=name, namespace=namespace, labels=labels, annotations=annotations,
                                env_secret=env_secret)
        self._gone.pop(sandbox_id, None)
        claimed = await self._claim_warm(spec, namespace, template, manifest)
        if claimed is not None:
            return await self._finish(claimed, restore, cold=False)
        manifest["metadata"]["annotations"][SEAL] = creation_mark(
            self._seal_key, namespace, name, labels.get(OWNER_KEY_LABEL, ""), labels[OPERATION_KEY_LABEL], described)

        made: list[str] = []  # uids of the env Secrets this provision created (only those it may delete)

        async def put_env() -> None:
            if env_secret is not None:
                # Before the Pod, so its container starts at once (a missing Secret holds it back for the kubelet's
                # retry period). Only a process killed between the two requests leaves the Secret without a Pod;
                # a retried provision of the same operation takes it over (same name).
                created = await self._put_env_secret(namespace, env_secret, labels, spec.env)
                if created is not None:
                    made.append(created)

        try:
            pod, adopted = await self._create_pod(core, manifest, spec, put_env)
        except BaseException:
            if env_secret is not None:
                for uid in made:  # never a Secret of that name someone else made
                    with contextlib.suppress(Exception):
                        await self._delete_env_secret(namespace, env_secret, uid)
            raise
        if not adopted:
            return await self._finish(pod, restore, env_secret=env_secret, cold=True)
        self._leases[sandbox_id] = float(pod["metadata"]["annotations"][LEASE_ANNOTATION])
        return self._handle(pod)

    async def _finish(self, pod: dict[str, Any], restore: Callable[[SandboxHandle], Any] | None, *, cold: bool,
                      env_secret: str | None = None) -> SandboxHandle:
        """Make a new Pod a sandbox: a cold one gets its env Secret, runs and passes the image probe (a claimed
        warm one did all that in the pool); then the restore, then the seal over its uid, which makes it one the
        operator adopts. A Pod that fails on the way is deleted (its uid: never another Pod of its name)."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            if cold:
                if env_secret is not None:
                    await self._own_env_secret(namespace, env_secret, pod)
                await self._wait_ready(namespace, name)
                await self._probe(self._handle(pod))
            if restore is not None:
                await restore(self._handle(pod))
            pod = await self._seal(pod)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._delete(namespace, name, pod["metadata"]["uid"])
            raise
        self._leases[f"{namespace}/{name}"] = float(pod["metadata"]["annotations"][LEASE_ANNOTATION])
        return self._handle(pod)

    async def _put_env_secret(self, namespace: str, name: str, labels: dict[str, str],
                              env: Mapping[str, str]) -> str | None:
        """Create the env Secret (its uid), or write the env into the one of that name already there (None)."""
        core = await self._api()
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace, "labels": labels}, "stringData": dict(env)}
        try:
            created = await api_body(core.create_namespaced_secret_without_preload_content(namespace, body))
            return str(created["metadata"]["uid"])
        except Exception as exc:
            if self._status(exc) != 409:
                raise self._provision_error(f"create the env Secret of {namespace}/{name}", exc) from None
            try:  # a retried provision: the same sandbox, its env as this spec says (patch: never read back)
                await api_body(core.patch_namespaced_secret_without_preload_content(
                    name, namespace, {"metadata": {"labels": labels, "ownerReferences": None},
                                      "stringData": dict(env)}), parse=False)
            except Exception as exc2:
                raise self._provision_error(f"update the env Secret of {namespace}/{name}", exc2) from None
        return None

    async def _delete_env_secret(self, namespace: str, name: str, uid: str) -> None:
        core = await self._api()
        try:
            await api_body(core.delete_namespaced_secret_without_preload_content(
                name, namespace, body={"preconditions": {"uid": uid}}), parse=False)
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

    async def _wait_ready(self, namespace: str, name: str) -> None:
        """Until the container runs, or a state that says it never will (with its reason and what to do)."""
        deadline = time.monotonic() + self.ready_timeout
        unschedulable_since: float | None = None
        delay = 0.05
        while True:
            pod = await self._read_pod(namespace, name)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                raise ProvisionError(f"Pod {namespace}/{name} was deleted while it started", retryable=True)
            status = pod.get("status") or {}
            for cs in status.get("containerStatuses") or []:
                state = cs.get("state") or {}
                if "running" in state and cs.get("ready", True) is not False:
                    return
                waiting = state.get("waiting") or {}
                reason = waiting.get("reason")
                if isinstance(reason, str) and reason in HOPELESS_REASONS:
                    message = str(waiting.get("message") or "").strip()
                    raise ProvisionError(
                        f"Pod {namespace}/{name}: {reason}: {HOPELESS_REASONS[reason]}" + (f" ({message})" if message else "")
                        + f"; image {cs.get('image')!r}: check the template's image, that it has /bin/sh, and "
                          f"that the node can pull it", retryable=False)
                terminated = state.get("terminated")
                if terminated:
                    raise ProvisionError(terminated_message(namespace, name, terminated), retryable=False)
            if status.get("phase") in ("Failed", "Succeeded"):
                raise ProvisionError(f"Pod {namespace}/{name} ended ({status.get('phase')}: "
                                     f"{status.get('reason') or status.get('message') or 'no reason given'})",
                                     retryable=False)
            scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
            if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
                unschedulable_since = unschedulable_since or time.monotonic()
                if time.monotonic() - unschedulable_since >= self.unschedulable_grace:
                    raise ProvisionError(
                        f"Pod {namespace}/{name} cannot be scheduled: {scheduled.get('message')}; lower the template's "
                        f"resource requests or its nodeSelector/tolerations, or add capacity", retryable=False)
            if time.monotonic() >= deadline:
                raise ProvisionError(f"Pod {namespace}/{name} was not running after {self.ready_timeout:g}s "
                                     f"(phase {status.get('phase')}); see `kubectl describe pod -n {namespace} {name}`",
                                     retryable=True)
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 1.5)



def pod_name(operation_id: str) -> str:
    return "dsb-" + hashlib.sha256(operation_id.encode()).hexdigest()[:20]
