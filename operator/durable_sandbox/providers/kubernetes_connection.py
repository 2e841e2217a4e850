"""The kubernetes provider's state and its connection to the API server: the client (made on first use), where
Pods live (namespaces), what an API error means (retryable, RBAC, admission), reading and listing Pods, and a
Pod as a handle.

The provider is this class and a layer per job above it, each a module: ``kubernetes_adoption.py`` (creating,
adopting, sealing, refusing and deleting Pods by identity), ``kubernetes_lifecycle.py`` (leases, loss, destroy,
listings), ``kubernetes_verification.py`` (each exec goes to the sealed Pod), ``kubernetes_calls.py`` (tool calls, the probe), ``kubernetes_warm.py`` (warm pool claims and pool
Pods), ``kubernetes_provisioning.py`` (templates, env Secrets, new Pods), ``kubernetes_snapshots.py``
(snapshots, restores) and ``kubernetes.py`` (``KubernetesProvider``: its configuration and capabilities)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from durable_sandbox.providers.archive_limit import configured_limit
from durable_sandbox.providers.contract import (
    RUNTIME_CLASS_KEY,
    ConfigurationError,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
)
from durable_sandbox.providers.kubernetes_exec import PodExec
from durable_sandbox.providers.kubernetes_identity import (
    META_ANNOTATION,
    identity_key,
)
from durable_sandbox.providers.kubernetes_pool import PoolClaim
from durable_sandbox.providers.kubernetes_template import (
    WORKSPACE,
    PodTemplate,
    TemplatePolicy,
)
from durable_sandbox.providers.lease_end import LeaseEnds
from durable_sandbox.providers.s3_snapshots import S3Config, S3SnapshotStore

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["HOPELESS_REASONS", "HOPELESS_WAITING", "KubernetesConnection", "api_body", "lease_seconds_of", "split_id",
           "terminated_message"]

MANAGED_BY: Final[Mapping[str, str]] = {"app.kubernetes.io/managed-by": "durable-sandbox"}
SANDBOX_LABEL = "durable-sandbox.dev/sandbox-pod"
INSTALLATION_KEY_LABEL = "durable-sandbox.dev/installation-key"
RUN_LABEL = "durable-sandbox.dev/run-id"
LEASE_ANNOTATION = "durable-sandbox.dev/lease-expires-at"
MAXIMUM_LEASE_SECONDS = 86_400
# How the authorizer words a refusal ('User "..." cannot create resource "pods" in API group "" in the
# namespace "demo"'); a 403 without it comes from admission (RuntimeClass, PodSecurity, webhooks).
_RBAC_REFUSAL = re.compile(r'\bcannot [a-z]+ resource "')
# Container states that will not get better by waiting: the provision fails at once, saying which and why.
HOPELESS_REASONS: Final[Mapping[str, str]] = {
    "ErrImagePull": "the image cannot be pulled", "ImagePullBackOff": "the image cannot be pulled",
    "ErrImageNeverPull": "the image is not on the node and the pull policy is Never",
    "InvalidImageName": "the image name is invalid", "CreateContainerConfigError": "the container's configuration is invalid",
    "CreateContainerError": "the container cannot be created", "RunContainerError": "the container cannot start",
    "CrashLoopBackOff": "the container keeps exiting", "StartError": "the container cannot start",
}
HOPELESS_WAITING = frozenset(HOPELESS_REASONS)
_ENV_NAMESPACE = "DSB_K8S_NAMESPACE"
# How big a snapshot's archive may be (archive_limit.py): default the workspace volume's sizeLimit.
ENV_SNAPSHOT_LIMIT = "DSB_K8S_SNAPSHOT_LIMIT"
SNAPSHOT_LIMIT_SETTING = f"the chart's providers.kubernetes.snapshots.sizeLimit ({ENV_SNAPSHOT_LIMIT})"
_ENV_NAMESPACES = "DSB_K8S_NAMESPACES"  # where an inventory looks (the chart's watchNamespaces)
ENV_READY_TIMEOUT = "DSB_K8S_READY_TIMEOUT"
ENV_UNSCHEDULABLE_GRACE = "DSB_K8S_UNSCHEDULABLE_GRACE"


class KubernetesConnection(SandboxProvider):
    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str | None = None,
        namespaces: list[str] | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        template: PodTemplate | None = None,
        policy: TemplatePolicy | None = None,
        store: S3SnapshotStore | S3Config | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        ready_timeout: float | None = None,
        unschedulable_grace: float | None = None,
        pool_key: bytes | None = None,
        pool_observer: Callable[[PoolClaim], None] | None = None,
        snapshot_limit: int | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.template = template if template is not None else PodTemplate.from_environ(env)
        self.snapshot_limit = snapshot_limit if snapshot_limit is not None else configured_limit(
            env, ENV_SNAPSHOT_LIMIT, self.template.workspace.size_limit, "the workspace's sizeLimit")
        self.policy = policy if policy is not None else TemplatePolicy.from_environ(env)
        if store is None and env.get("DSB_S3_BUCKET"):
            store = S3Config.from_environ(env)
        self.store = S3SnapshotStore(store) if isinstance(store, S3Config) else store
        self._kubeconfig = kubeconfig
        self._context = context
        self._namespace = namespace or env.get(_ENV_NAMESPACE) or None
        listed = namespaces if namespaces is not None else [n for n in (env.get(_ENV_NAMESPACES) or "").split(",") if n]
        self._namespaces = [n.strip() for n in listed if n.strip()]
        self.ready_timeout = ready_timeout if ready_timeout is not None else float(env.get(ENV_READY_TIMEOUT) or 120)
        self.unschedulable_grace = (unschedulable_grace if unschedulable_grace is not None
                                    else float(env.get(ENV_UNSCHEDULABLE_GRACE) or 30))
        self._clock = clock
        self.workspace = WORKSPACE  # where the template mounts the workspace volume (the scripts' root)
        self._api_client: Any = None
        self._core: Any = None
        self._exec: PodExec | None = None
        self._connect_lock = asyncio.Lock()
        # Lease ends as this process believes them: a Pod's annotation may only make one later (lease_end.py).
        self._leases = LeaseEnds(clock)
        # Sandbox id -> why it is gone, for Pods this process deleted: a terminating Pod may still answer an exec
        # for its grace period, and a call that ran there would be lost with it.
        self._gone: dict[str, str] = {}
        # Warm pools (providers/kubernetes_pool.py): without the operator's key no pool Pod is trusted, so none
        # is claimed and every provision makes its Pod.
        self._pool_key = pool_key
        self._pool_observer = pool_observer
        # Sandbox Pods are the operator's by a seal over their uid (providers/kubernetes_identity.py), never by
        # their labels; refusals already reported (Pod uids), so each is said once, not on every listing.
        self._seal_key = identity_key(pool_key)
        self._reported: set[str] = set()

    @property
    def pool_key(self) -> bytes | None:
        """The key of pool seals (None: no pool Pod is trusted). Never printed."""
        return self._pool_key

    def __repr__(self) -> str:
        return f"KubernetesProvider(namespace={self._namespace!r}, store={self.store!r})"

    async def aclose(self) -> None:
        client, self._api_client, self._core, self._exec = self._api_client, None, None, None
        if client is not None:
            await client.close()
        if self.store is not None:
            await self.store.aclose()

    async def _api(self) -> Any:
        if self._core is None:
            async with self._connect_lock:
                if self._core is None:
                    from kubernetes.aio import client as k8s

                    from durable_sandbox.providers.kubernetes_api import default_namespace, load_configuration

                    configuration = await load_configuration(kubeconfig=self._kubeconfig, context=self._context)
                    if self._namespace is None:
                        self._namespace = default_namespace(kubeconfig=self._kubeconfig, context=self._context)
                    self._api_client = k8s.ApiClient(configuration)
                    self._exec = PodExec(self._api_client)
                    self._core = k8s.CoreV1Api(self._api_client)
        return self._core

    @property
    def default_namespace(self) -> str:
        return self._namespace or "default"

    def _namespace_for(self, owner: str | None) -> str:
        namespace, sep, _ = (owner or "").partition("/")
        return namespace if sep and namespace else self.default_namespace

    def _inventory_namespaces(self) -> list[str]:
        return self._namespaces or [self.default_namespace]

    @staticmethod
    def _status(exc: BaseException) -> int | None:
        from kubernetes.aio.client.exceptions import ApiException

        return exc.status if isinstance(exc, ApiException) else None

    @staticmethod
    def _reason(exc: BaseException) -> str:
        body = getattr(exc, "body", None)
        try:
            message = json.loads(body).get("message") if body else None
        except (TypeError, ValueError):
            message = None
        return str(message or getattr(exc, "reason", "") or type(exc).__name__)

    def _api_error(self, what: str, exc: BaseException) -> ProviderError:
        status = self._status(exc)
        if status in (401, 403):
            return ConfigurationError(f"{what}: the API server refused the operator ({status}: {self._reason(exc)}); "
                                      f"check the operator's RBAC in this namespace (the chart's watchNamespaces)")
        error = ProviderError(f"{what}: {status or type(exc).__name__}: {self._reason(exc)}")
        error.retryable = status is None or status >= 500 or status == 429
        return error

    def _provision_error(self, what: str, exc: BaseException) -> ProviderError:
        status = self._status(exc)
        if status in (400, 422):
            return ProvisionError(f"{what}: the API server refused the Pod: {self._reason(exc)}", retryable=False)
        reason = self._reason(exc)
        if status == 403 and "exceeded quota" in reason:
            return ProvisionError(f"{what}: {reason}", retryable=True)
        if status == 403 and not _RBAC_REFUSAL.search(reason):
            # Admission refused this Pod, not RBAC the operator: a RuntimeClass the cluster lacks, PodSecurity, a
            # validating webhook. Trying again makes the same Pod, and the operator's rights are not the cause.
            hint = (" (the template's runtimeClassName names a RuntimeClass this cluster does not have: "
                    "kubectl get runtimeclass lists those it has)" if "RuntimeClass" in reason else "")
            return ProvisionError(f"{what}: the cluster's admission refused the Pod: {reason}{hint}", retryable=False)
        error = self._api_error(what, exc)
        if isinstance(error, ConfigurationError):
            return error
        return ProvisionError(str(error), retryable=error.retryable)

    async def _read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        core = await self._api()
        try:
            return await api_body(core.read_namespaced_pod_without_preload_content(name, namespace))
        except Exception as exc:
            if self._status(exc) == 404:
                return None
            raise self._api_error(f"read Pod {namespace}/{name}", exc) from None

    async def _pods(self, namespaces: list[str], selector: str) -> list[dict[str, Any]]:
        core = await self._api()
        found: list[dict[str, Any]] = []
        for namespace in namespaces:
            try:
                listing = await api_body(core.list_namespaced_pod_without_preload_content(namespace, label_selector=selector))
            except Exception as exc:
                raise self._api_error(f"list the sandbox Pods in namespace {namespace}", exc) from None
            found.extend(listing.get("items") or [])
        return found

    def _handle(self, pod: dict[str, Any]) -> SandboxHandle:
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        try:
            described = json.loads(annotations.get(META_ANNOTATION) or "{}")
        except ValueError:
            described = {}
        lease = annotations.get(LEASE_ANNOTATION)
        metadata: dict[str, Any] = {"namespace": meta["namespace"], "pod": meta["name"], "uid": meta.get("uid"),
                                    "owner": described.get("owner"), "labels": dict(described.get("labels") or {})}
        # The Pod's own field: what admission let through (a RuntimeClass that also sets it, or a mutating
        # webhook, shows here), not what the template asked for.
        if runtime_class := (pod.get("spec") or {}).get("runtimeClassName"):
            metadata[RUNTIME_CLASS_KEY] = runtime_class
        return SandboxHandle(id=f"{meta['namespace']}/{meta['name']}", provider=self.name, metadata=metadata,
                             lease_expires_at=float(lease) if lease else None)



def lease_seconds_of(pod: dict[str, Any] | None) -> float:
    """The lease length sealed in a sandbox Pod's description (``leaseSeconds``), else the longest there is."""
    annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    try:
        seconds = json.loads(annotations.get(META_ANNOTATION) or "{}").get("leaseSeconds")
    except (ValueError, AttributeError):
        seconds = None
    return float(seconds) if isinstance(seconds, int) and 0 < seconds <= MAXIMUM_LEASE_SECONDS else MAXIMUM_LEASE_SECONDS


def split_id(sandbox_id: str) -> tuple[str, str]:
    namespace, _, name = sandbox_id.partition("/")
    if not name:
        raise SandboxGone(sandbox_id, "not a kubernetes sandbox id (<namespace>/<pod>)")
    return namespace, name


async def api_body(call: Any, *, parse: bool = True) -> dict[str, Any]:
    from durable_sandbox.providers.kubernetes_api import json_body  # kubernetes.aio: loaded on first use

    return await json_body(call, parse=parse)



def terminated_message(namespace: str, name: str, terminated: Mapping[str, Any]) -> str:
    reason = terminated.get("reason") or "Error"
    message = str(terminated.get("message") or "").strip()
    hint = {"OOMKilled": "raise the template's memory limit",
            "StartError": "the image needs /bin/sh (the keep-alive command)",
            "ContainerCannotRun": "the image needs /bin/sh (the keep-alive command)"}.get(reason, "see the Pod's events")
    return (f"the container of Pod {namespace}/{name} ended: {reason} (exit {terminated.get('exitCode')})"
            + (f": {message}" if message else "") + f"; {hint}")
