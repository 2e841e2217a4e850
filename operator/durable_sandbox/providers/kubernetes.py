"""The ``kubernetes`` provider: a sandbox is a Pod, tool calls run through the API server's ``pods/exec``, and
snapshots of its workspace volume go to object storage through the S3 API.

Where things are:

* **The Pod** lives in the namespace of the sandbox's owner (the operator's owner tag is ``<namespace>/<uid>``
  of the Workflow or Sandbox), else in ``DSB_K8S_NAMESPACE`` (default: the kubeconfig context's namespace).
  It is made from a template (``providers/kubernetes_template.py``: the operator's default, a PodTemplate
  object, or an image) checked against the operator's policy, and named from the provision's operation id
  (``dsb-<digest>``), so a create repeated after a lost answer finds the same Pod, and an operator that
  restarts adopts what it made. Labels: the owner's, the installation's and the operation's keys
  (:func:`tag_key` digests: label values cannot hold ``/``), the run id where it is a valid label value; the
  full owner and spec labels, and the lease's expiry, are annotations.
* **The sandbox's env** (``spec.env``, may hold secrets) is a Secret of its own (``<pod>-env``, ``envFrom``),
  owned by the Pod, so it goes when the Pod goes; never in the Pod's spec, a handle or a message.
* **Calls** are one exec each (``providers/kubernetes_exec.py``) of a fixed boot command that reads its script
  from stdin (``providers/kubernetes_scripts.py``): output is kept as the journal's head/tail rule says
  (``providers/output.py``), a timeout kills every process of the call in the Pod (by a tag in their
  environment) and answers exit 124, and a call's leftover background processes are killed when it ends.
* **Snapshots** are ``tar`` of the workspace volume (``/workspace``: not the container's root filesystem,
  not running processes), streamed from the exec to the store as it comes, and back into a fresh Pod for a
  restore; memory stays bounded whatever the size. Store settings and credentials come only from the
  operator's environment (``DSB_S3_*``, from the Secret the chart names): never from a Workflow, never
  into the sandbox. Without them the provider offers no snapshots (its capabilities say so).
* **Leases** are an annotation, renewed by ``renew_lease``; a Pod whose lease has run out is deleted when it
  is next touched and by every inventory (the orphan sweep), so a Pod nobody renews does not live on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from durable_sandbox.providers import kubernetes_scripts as scripts
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    RUNTIME_CLASS_KEY,
    TOOL_TYPES,
    Capability,
    ConfigurationError,
    ProviderCapabilities,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    SnapshotEntry,
    ToolCall,
    ToolResult,
    file_not_found_result,
    safe_relative_path,
    tag_key,
    unsupported_tool_result,
    wrote_file_result,
)
from durable_sandbox.providers.kubernetes_exec import ExecFailed, ExecRejected, PodExec, StreamBroken
from durable_sandbox.providers.kubernetes_identity import (
    META_ANNOTATION,
    SEAL,
    completion_seal,
    creation_mark,
    identify,
    identity_key,
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
from durable_sandbox.providers.kubernetes_removal import delete_owned_secret, delete_pod, pod_event
from durable_sandbox.providers.kubernetes_template import (
    CONTAINER,
    WORKSPACE,
    PodTemplate,
    TemplatePolicy,
    pod_template_reference,
)
from durable_sandbox.providers.output import OutputBuffer
from durable_sandbox.providers.s3_snapshots import S3Config, S3SnapshotStore, SnapshotMissing, SnapshotName

log = logging.getLogger(__name__)

__all__ = ["KubernetesProvider"]

MANAGED_BY = {"app.kubernetes.io/managed-by": "durable-sandbox"}
SANDBOX_LABEL = "durable-sandbox.dev/sandbox-pod"
INSTALLATION_KEY_LABEL = "durable-sandbox.dev/installation-key"
RUN_LABEL = "durable-sandbox.dev/run-id"
LEASE_ANNOTATION = "durable-sandbox.dev/lease-expires-at"
TIMEOUT_EXIT_CODE = 124
_KILLED_EXIT_CODES = frozenset({128 + 9, 128 + 15})  # the exec's shell ended by SIGKILL or SIGTERM
MAXIMUM_LEASE_SECONDS = 86_400
STALE_UPLOAD_SECONDS = 3600.0  # an unfinished snapshot upload older than this is a dead taking's
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Container states that will not get better by waiting: the provision fails at once, saying which and why.
# How the authorizer words a refusal ('User "..." cannot create resource "pods" in API group "" in the
# namespace "demo"'); a 403 without it comes from admission (RuntimeClass, PodSecurity, webhooks).
_RBAC_REFUSAL = re.compile(r'\bcannot [a-z]+ resource "')
_HOPELESS_WAITING = {
    "ErrImagePull": "the image cannot be pulled", "ImagePullBackOff": "the image cannot be pulled",
    "ErrImageNeverPull": "the image is not on the node and the pull policy is Never",
    "InvalidImageName": "the image name is invalid", "CreateContainerConfigError": "the container's configuration is invalid",
    "CreateContainerError": "the container cannot be created", "RunContainerError": "the container cannot start",
    "CrashLoopBackOff": "the container keeps exiting", "StartError": "the container cannot start",
}
HOPELESS_WAITING = frozenset(_HOPELESS_WAITING)
_ENV_NAMESPACE = "DSB_K8S_NAMESPACE"
_ENV_NAMESPACES = "DSB_K8S_NAMESPACES"  # where an inventory looks (the chart's watchNamespaces)
_ENV_READY_TIMEOUT = "DSB_K8S_READY_TIMEOUT"
_ENV_DISABLED = "DSB_K8S_DISABLED"  # why the operator may not use this provider (the chart sets it)
_ENV_UNSCHEDULABLE_GRACE = "DSB_K8S_UNSCHEDULABLE_GRACE"
_KILL_GRACE_SECONDS = 5.0


def pod_name(operation_id: str) -> str:
    return "dsb-" + hashlib.sha256(operation_id.encode()).hexdigest()[:20]


def _split_id(sandbox_id: str) -> tuple[str, str]:
    namespace, _, name = sandbox_id.partition("/")
    if not name:
        raise SandboxGone(sandbox_id, "not a kubernetes sandbox id (<namespace>/<pod>)")
    return namespace, name


class _InvalidCall(Exception):
    """Arguments a call cannot run with: a failed result (exit 1, this text), as for the other providers."""


class KubernetesProvider(SandboxProvider):
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
    ) -> None:
        env = os.environ if environ is None else environ
        self.template = template if template is not None else PodTemplate.from_environ(env)
        self.policy = policy if policy is not None else TemplatePolicy.from_environ(env)
        if store is None and env.get("DSB_S3_BUCKET"):
            store = S3Config.from_environ(env)
        self.store = S3SnapshotStore(store) if isinstance(store, S3Config) else store
        self._kubeconfig = kubeconfig
        self._context = context
        self._namespace = namespace or env.get(_ENV_NAMESPACE) or None
        listed = namespaces if namespaces is not None else [n for n in (env.get(_ENV_NAMESPACES) or "").split(",") if n]
        self._namespaces = [n.strip() for n in listed if n.strip()]
        self.ready_timeout = ready_timeout if ready_timeout is not None else float(env.get(_ENV_READY_TIMEOUT) or 120)
        self.unschedulable_grace = (unschedulable_grace if unschedulable_grace is not None
                                    else float(env.get(_ENV_UNSCHEDULABLE_GRACE) or 30))
        self._clock = clock
        self.workspace = WORKSPACE  # where the template mounts the workspace volume (the scripts' root)
        self._api_client: Any = None
        self._core: Any = None
        self._exec: PodExec | None = None
        self._connect_lock = asyncio.Lock()
        self._leases: dict[str, float] = {}  # sandbox id -> lease expiry this process knows (renewals)
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

    @classmethod
    def configuration_problems(cls, environ: Mapping[str, str]) -> list[str]:
        disabled = environ.get(_ENV_DISABLED)
        if disabled:
            return [f"Sandbox provider [kubernetes] is off in this operator: {disabled}"]
        problems = []
        try:
            PodTemplate.from_environ(environ)
            TemplatePolicy.from_environ(environ)
        except ConfigurationError as exc:
            problems.append(str(exc))
        if environ.get("DSB_S3_BUCKET") or environ.get("DSB_S3_ENDPOINT"):
            problems += S3Config.environ_problems(environ)
        for key in (_ENV_READY_TIMEOUT, _ENV_UNSCHEDULABLE_GRACE):
            raw = environ.get(key)
            if raw:
                try:
                    ok = float(raw) > 0
                except ValueError:
                    ok = False
                if not ok:
                    problems.append(f"Sandbox provider [kubernetes]: {key} must be a positive number of seconds, got {raw!r}")
        return problems

    def capabilities(self) -> ProviderCapabilities:
        supported = {Capability.LEASE_RECONCILIATION, Capability.INVENTORY, Capability.LOSS_INJECTION}
        if self.store is not None:
            supported |= {Capability.SNAPSHOT, Capability.SNAPSHOT_DELETION, Capability.SNAPSHOT_RECONCILIATION,
                          Capability.RESTORE}
        return ProviderCapabilities(supported=frozenset(supported), delivery_guarantee="at_least_once_effects",
                                    idempotent_destroy=True, maximum_lease_seconds=MAXIMUM_LEASE_SECONDS,
                                    tool_types=TOOL_TYPES)

    async def aclose(self) -> None:
        client, self._api_client, self._core, self._exec = self._api_client, None, None, None
        if client is not None:
            await client.close()
        if self.store is not None:
            await self.store.aclose()

    # ------------------------------------------------------------------------------------- API plumbing

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

    async def _read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        core = await self._api()
        try:
            return await _body(core.read_namespaced_pod_without_preload_content(name, namespace))
        except Exception as exc:
            if self._status(exc) == 404:
                return None
            raise self._api_error(f"read Pod {namespace}/{name}", exc) from None

    # ------------------------------------------------------------------------------------- provision

    async def pool_template(self, namespace: str, reference: str) -> PodTemplate:
        """PodTemplate ``reference`` of ``namespace`` as a provision would use it (the policy checked)."""
        return await self._template_for(SandboxSpec(template=f"podtemplate/{reference}"), namespace)

    async def _template_for(self, spec: SandboxSpec, namespace: str) -> PodTemplate:
        reference = pod_template_reference(spec.template)
        if reference is not None:
            core = await self._api()
            try:
                body = await _body(core.read_namespaced_pod_template_without_preload_content(reference, namespace))
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

        async def put_env() -> None:
            if env_secret is not None:
                # Before the Pod, so its container starts at once (a missing Secret holds it back for the kubelet's
                # retry period). Only a process killed between the two requests leaves the Secret without a Pod;
                # a retried provision of the same operation takes it over (same name).
                await self._put_env_secret(namespace, env_secret, labels, spec.env)

        try:
            pod, adopted = await self._create_pod(core, manifest, spec, put_env)
        except BaseException:
            if env_secret is not None:
                with contextlib.suppress(Exception):
                    await self._delete_env_secret(namespace, env_secret)
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
            sealed = await _body(core.patch_namespaced_pod_without_preload_content(
                meta["name"], meta["namespace"], {"metadata": {"annotations": {SEAL: seal}}}))
        except Exception as exc:
            raise self._provision_error(f"seal Pod {meta['namespace']}/{meta['name']}", exc) from None
        if sealed["metadata"].get("uid") != meta["uid"]:  # replaced meanwhile: the seal does not fit the new one
            raise ProvisionError(f"Pod {meta['namespace']}/{meta['name']} was replaced by another Pod while it "
                                 f"started", retryable=True)
        return sealed

    # ------------------------------------------------------------------------------------- warm pools

    def _observe_pool(self, namespace: str, pool: str, outcome: str, reason: str, started: float) -> None:
        if self._pool_observer is not None:
            with contextlib.suppress(Exception):  # metrics never fail a provision
                self._pool_observer(PoolClaim(namespace, pool, outcome, reason, time.monotonic() - started))

    async def _claim_warm(self, spec: SandboxSpec, namespace: str, template: PodTemplate,
                          manifest: dict[str, Any]) -> dict[str, Any] | None:
        """A warm Pod of this template claimed for this provision (one conditional patch), or None: a miss, and
        the caller makes the Pod (cold). See providers/kubernetes_pool.py for what is trusted and why."""
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
            patch = claim_patch(pod, key=self._pool_key, pool=pool, labels=labels, annotations=annotations)
            try:
                won = await _body(core.patch_namespaced_pod_without_preload_content(pod["metadata"]["name"], namespace,
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
            await _body(core.create_namespaced_pod_without_preload_content(namespace, manifest), parse=False)
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
            await _body(core.patch_namespaced_pod_without_preload_content(name, namespace, {"metadata": {
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
                return await _body(core.create_namespaced_pod_without_preload_content(namespace, manifest)), False
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

    async def _put_env_secret(self, namespace: str, name: str, labels: dict[str, str], env: Mapping[str, str]) -> None:
        core = await self._api()
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace, "labels": labels}, "stringData": dict(env)}
        try:
            await _body(core.create_namespaced_secret_without_preload_content(namespace, body), parse=False)
        except Exception as exc:
            if self._status(exc) != 409:
                raise self._provision_error(f"create the env Secret of {namespace}/{name}", exc) from None
            try:  # a retried provision: the same sandbox, its env as this spec says (patch: never read back)
                await _body(core.patch_namespaced_secret_without_preload_content(
                    name, namespace, {"metadata": {"labels": labels, "ownerReferences": None},
                                      "stringData": dict(env)}), parse=False)
            except Exception as exc2:
                raise self._provision_error(f"update the env Secret of {namespace}/{name}", exc2) from None

    async def _delete_env_secret(self, namespace: str, name: str) -> None:
        core = await self._api()
        try:
            await _body(core.delete_namespaced_secret_without_preload_content(name, namespace), parse=False)
        except Exception as exc:
            if self._status(exc) != 404:
                raise self._api_error(f"delete Secret {namespace}/{name}", exc) from None

    async def _own_env_secret(self, namespace: str, name: str, pod: dict[str, Any]) -> None:
        """The Pod owns its env Secret, so the cluster deletes the Secret with the Pod, however the Pod goes."""
        core = await self._api()
        owner = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        try:
            await _body(core.patch_namespaced_secret_without_preload_content(
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
                if reason in _HOPELESS_WAITING:
                    message = str(waiting.get("message") or "").strip()
                    raise ProvisionError(
                        f"Pod {namespace}/{name}: {reason}: {_HOPELESS_WAITING[reason]}" + (f" ({message})" if message else "")
                        + f"; image {cs.get('image')!r}: check the template's image, that it has /bin/sh, and "
                          f"that the node can pull it", retryable=False)
                terminated = state.get("terminated")
                if terminated:
                    raise ProvisionError(_terminated(namespace, name, terminated), retryable=False)
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

    async def _probe(self, handle: SandboxHandle) -> None:
        stderr = OutputBuffer(4096)
        try:
            code = await self._run(handle, scripts.probe(workspace=self.workspace), stderr=stderr.feed, what="check the image")
        except ExecFailed as exc:
            raise ProvisionError(f"sandbox {handle.id}: the image cannot run /bin/sh ({exc}); a sandbox image needs "
                                 f"a POSIX shell and tar", retryable=False) from None
        if code == scripts.PROBE_MISSING:
            raise ProvisionError(f"sandbox {handle.id}: the image has no {stderr.text().strip()!r}; a sandbox image "
                                 f"needs sh, tar, head, cat, tr, mkdir, mv, rm and readlink (busybox has them)",
                                 retryable=False)
        if code != 0:
            raise ProvisionError(f"sandbox {handle.id}: {stderr.text().strip() or f'the image check exited {code}'}",
                                 retryable=False)

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

    # ------------------------------------------------------------------------------------- lifecycle

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        namespace, name = _split_id(handle.id)
        await self._require_live(handle)
        core = await self._api()
        expires = self._clock() + seconds
        try:
            pod = await _body(core.patch_namespaced_pod_without_preload_content(
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
        self._leases[handle.id] = expires
        return self._handle(pod)

    async def destroy(self, handle: SandboxHandle) -> None:
        self._gone[handle.id] = "it was destroyed"
        self._leases.pop(handle.id, None)
        await self._delete_handle(handle)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        """Delete the Pod behind the caller's back, as an eviction would (testing aid). The sandbox is gone when
        this returns, as the contract says, although the Pod may answer for its grace period yet."""
        self._gone[handle.id] = "loss was injected: its Pod was deleted"
        await self._delete_handle(handle)

    async def _delete_handle(self, handle: SandboxHandle) -> None:
        """Delete the Pod of ``handle``: the uid it recorded, or (a handle recorded without one) the Pod of its
        name only if the operator sealed it; anything else under that name is not the sandbox's."""
        namespace, name = _split_id(handle.id)
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
        """Delete Pod ``namespace/name`` if it is Pod ``uid``, and its env Secret if that Pod owns it."""
        core = await self._api()
        try:
            await delete_pod(core, namespace, name, uid)
        except Exception as exc:
            raise self._api_error(f"delete Pod {namespace}/{name}", exc) from None
        try:
            await delete_owned_secret(core, namespace, f"{name}-env", uid)
        except Exception as exc:
            raise self._api_error(f"delete Secret {namespace}/{name}-env", exc) from None

    async def _require_live(self, handle: SandboxHandle) -> None:
        if handle.id in self._gone:
            raise SandboxGone(handle.id, self._gone[handle.id])
        expires = max(self._leases.get(handle.id, 0.0), handle.lease_expires_at or 0.0)
        if expires and self._clock() >= expires:
            self._gone[handle.id] = "its lease ran out; the Pod was deleted"
            await self._delete_handle(handle)
            raise SandboxGone(handle.id, "its lease ran out; the Pod was deleted")

    async def _lost(self, handle: SandboxHandle, exc: BaseException) -> BaseException:
        """What a failed exec means: the sandbox is gone (with why) or a transient failure to retry."""
        namespace, name = _split_id(handle.id)
        pod = await self._read_pod(namespace, name)
        if pod is None:
            return SandboxGone(handle.id, "its Pod no longer exists")
        if pod["metadata"].get("deletionTimestamp"):
            return SandboxGone(handle.id, "its Pod is being deleted")
        status = pod.get("status") or {}
        for cs in status.get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated:
                return SandboxGone(handle.id, _terminated(namespace, name, terminated))
        if status.get("phase") in ("Failed", "Succeeded"):
            return SandboxGone(handle.id, f"its Pod ended ({status.get('phase')}: {status.get('reason') or ''})".strip())
        if isinstance(exc, ExecRejected) and exc.status == 404:
            return SandboxGone(handle.id, "its Pod no longer exists")
        return exc

    async def _run(self, handle: SandboxHandle, script: bytes, *, stdout: Callable[[bytes], Any] | None = None,
                   stderr: Callable[[bytes], Any] | None = None, data: AsyncIterator[bytes] | None = None,
                   what: str) -> int:
        """One exec of ``script`` (then ``data``) in the sandbox; its exit code. Loss is :class:`SandboxGone`."""
        namespace, name = _split_id(handle.id)
        await self._api()
        assert self._exec is not None

        async def stdin() -> AsyncIterator[bytes]:
            yield script
            if data is not None:
                async for chunk in data:
                    yield chunk

        try:
            outcome = await self._exec.run(namespace, name, CONTAINER, scripts.boot_command(script),
                                           stdout=stdout or _discard, stderr=stderr or _discard, stdin=stdin(),
                                           what=f"{what} in sandbox {handle.id}")
        except (ExecRejected, StreamBroken) as exc:
            raise await self._lost(handle, exc) from None
        except ExecFailed as exc:
            lost = await self._lost(handle, exc)
            raise lost from None
        if outcome.exit_code in _KILLED_EXIT_CODES:
            # A Pod deleted or evicted while a call runs stops its container: the exec's shell is killed and
            # the status channel says 137 (or 143) instead of breaking the stream. That is the sandbox lost,
            # not the call's outcome; recorded as a result, a replay after restore could never match it.
            gone = await self._lost(handle, ProviderError(f"{what} in sandbox {handle.id}: killed"))
            if isinstance(gone, SandboxGone):
                raise gone
        return outcome.exit_code

    # ------------------------------------------------------------------------------------- calls

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        if call.type not in TOOL_TYPES:
            return unsupported_tool_result(call.type)
        await self._require_live(handle)
        try:
            if call.type == "shell":
                return await self._shell(handle, call)
            if call.type == "write_file":
                return await self._write_file(handle, call)
            return await self._read_file(handle, call)
        except _InvalidCall as exc:
            return ToolResult(exit_code=1, stdout="", stderr=str(exc))

    async def _shell(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        command, timeout, cwd, env = _shell_args(call)
        tag = hashlib.sha256(f"{handle.id}\0{call.operation_id}\0{secrets.token_hex(8)}".encode()).hexdigest()[:24]
        out, err = OutputBuffer(), OutputBuffer()
        script = scripts.shell(command, tag=tag, cwd=cwd, env=env, workspace=self.workspace)
        task = asyncio.ensure_future(self._run(handle, script, stdout=out.feed, stderr=err.feed,
                                               what=f"shell call {call.operation_id}"))
        try:
            done, _ = await asyncio.wait([task], timeout=timeout)
            if not done:
                await self._kill_call(handle, tag)
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), _KILL_GRACE_SECONDS)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                assert timeout is not None
                text = err.text()
                separator = "\n" if text and not text.endswith("\n") else ""
                return ToolResult(exit_code=TIMEOUT_EXIT_CODE, stdout=out.text(),
                                  stderr=f"{text}{separator}Command timed out after {timeout:g} seconds",
                                  stdout_size=out.full_size, stderr_size=err.full_size)
            code = task.result()
        except asyncio.CancelledError:
            # A cancelled step must not leave its command running in the Pod.
            task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill_call(handle, tag))
            raise
        return ToolResult(exit_code=code, stdout=out.text(), stderr=err.text(), stdout_size=out.full_size,
                          stderr_size=err.full_size)

    async def _kill_call(self, handle: SandboxHandle, tag: str) -> None:
        with contextlib.suppress(ProviderError):
            await self._run(handle, scripts.kill_call(tag), what="stop a timed-out call")

    async def _read_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = _path_arg(call)
        out, err = OutputBuffer(), OutputBuffer(4096)
        code = await self._run(handle, scripts.read_file(path, workspace=self.workspace), stdout=out.feed, stderr=err.feed,
                               what=f"read {path}")
        if code == 0:
            return ToolResult(exit_code=0, stdout=out.text(), stderr="", stdout_size=out.full_size)
        return _file_failure(code, path, "read", err)

    async def _write_file(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        path = _path_arg(call)
        contents = call.args.get("contents")
        if not isinstance(contents, str):
            raise _InvalidCall("Invalid arguments for write_file: 'contents' must be a str")
        data = contents.encode("utf-8")
        err = OutputBuffer(4096)
        code = await self._run(handle, scripts.write_file(path, len(data), workspace=self.workspace), stderr=err.feed, data=_chunks(data),
                               what=f"write {path}")
        if code == 0:
            return wrote_file_result(path, len(data))
        return _file_failure(code, path, "write", err)

    # ------------------------------------------------------------------------------------- snapshots

    def _store(self, capability: Capability) -> S3SnapshotStore:
        if self.store is None:
            raise _unsupported(capability)
        return self.store

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        store = self._store(Capability.SNAPSHOT)
        labels = handle.metadata.get("labels") or {}
        owner = handle.metadata.get("owner")
        name = SnapshotName.for_operation(operation_id, installation=labels.get(INSTALLATION_LABEL),
                                          owner=owner if isinstance(owner, str) else None,
                                          retained=RETAIN_LABEL in labels)
        # Reconciliation first: a retry after a lost answer finds the stored one even if the Pod is gone.
        if await store.exists(name):
            return name.id
        await self._require_live(handle)
        err = OutputBuffer(4096)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=8)  # bounded: the exec waits for the store

        async def produce() -> int:
            try:
                return await self._run(handle, scripts.archive(workspace=self.workspace), stdout=queue.put, stderr=err.feed,
                                       what=f"snapshot (operation {operation_id})")
            finally:
                await queue.put(None)

        producer = asyncio.ensure_future(produce())

        async def archive() -> AsyncIterator[bytes]:
            while (chunk := await queue.get()) is not None:
                yield chunk
            code = await producer  # the archive is only complete if tar said so: else the upload is aborted
            if code != 0:
                raise ProviderError(f"snapshot of {handle.id}: tar exited {code}: {err.text().strip()}")

        try:
            await store.put(name, archive(), metadata={"sandbox": handle.id.replace("/", "."),
                                                       "operation": tag_key(operation_id)})
        finally:
            if not producer.done():
                producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await producer
        return name.id

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        store = self._store(Capability.RESTORE)
        name = SnapshotName.parse(snapshot_id)
        if name is None:
            raise SnapshotMissing(snapshot_id)
        size, data = await store.open(name)  # missing: raised before a Pod is made

        async def fill(handle: SandboxHandle) -> None:
            err = OutputBuffer(4096)
            code = await self._run(handle, scripts.extract(size, workspace=self.workspace), stderr=err.feed, data=data,
                                   what=f"restore snapshot {snapshot_id}")
            if code != 0:
                raise ProvisionError(f"restore of snapshot {snapshot_id} into {handle.id}: tar exited {code}: "
                                     f"{err.text().strip()}", retryable=True)

        try:
            return await self._provision(spec, lease_seconds, restore=fill)
        finally:
            with contextlib.suppress(Exception):
                await data.aclose()

    async def delete_snapshot(self, snapshot_id: str) -> None:
        store = self._store(Capability.SNAPSHOT_DELETION)
        name = SnapshotName.parse(snapshot_id)
        if name is not None:  # anything else was never stored here: nothing to delete
            await store.delete(name)

    # ------------------------------------------------------------------------------------- inventory

    async def _pods(self, namespaces: list[str], selector: str) -> list[dict[str, Any]]:
        core = await self._api()
        found: list[dict[str, Any]] = []
        for namespace in namespaces:
            try:
                listing = await _body(core.list_namespaced_pod_without_preload_content(namespace, label_selector=selector))
            except Exception as exc:
                raise self._api_error(f"list the sandbox Pods in namespace {namespace}", exc) from None
            found.extend(listing.get("items") or [])
        return found

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
            if handle.lease_expires_at is not None and self._clock() >= max(handle.lease_expires_at,
                                                                            self._leases.get(handle.id, 0.0)):
                # (An unfinished attempt, marked for this name by the operator, goes too once its lease ran out:
                # its provision died; a retry would have made it again.)
                await self._remove(pod, f"its lease ran out at {handle.lease_expires_at:.0f} (nobody renewed it)")
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

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        if self.store is None:
            return []
        # Parts of takings that died mid-upload are no snapshot: the sweep that lists snapshots aborts them.
        await self.store.abort_stale_uploads(installation, older_than=STALE_UPLOAD_SECONDS)
        return await self.store.inventory(installation, provider=self.name)


# ----------------------------------------------------------------------------------------- helpers


def _unsupported(capability: Capability) -> ProviderError:
    from durable_sandbox.providers.contract import UnsupportedCapability

    return UnsupportedCapability("kubernetes", capability)


async def _body(call: Any, *, parse: bool = True) -> dict[str, Any]:
    from durable_sandbox.providers.kubernetes_api import json_body  # kubernetes.aio: loaded on first use

    return await json_body(call, parse=parse)


def _discard(_: bytes) -> None:
    return None


async def _chunks(data: bytes, size: int = 256 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def _terminated(namespace: str, name: str, terminated: Mapping[str, Any]) -> str:
    reason = terminated.get("reason") or "Error"
    message = str(terminated.get("message") or "").strip()
    hint = {"OOMKilled": "raise the template's memory limit",
            "StartError": "the image needs /bin/sh (the keep-alive command)",
            "ContainerCannotRun": "the image needs /bin/sh (the keep-alive command)"}.get(reason, "see the Pod's events")
    return (f"the container of Pod {namespace}/{name} ended: {reason} (exit {terminated.get('exitCode')})"
            + (f": {message}" if message else "") + f"; {hint}")


def _file_failure(code: int, path: str, verb: str, err: OutputBuffer) -> ToolResult:
    if code == scripts.NOT_FOUND:
        if verb == "read":
            return file_not_found_result(path)
        text = f"Cannot write {path}: a parent directory is missing"
    elif code == scripts.IS_DIRECTORY:
        text = f"Cannot {verb} {path}: Is a directory"
    elif code == scripts.OUTSIDE:
        text = f"Unsafe path: {path}: it resolves outside the workspace through a symlink"
    elif code == scripts.NOT_REGULAR:
        text = f"Cannot {verb} {path}: it is not a regular file; only regular files can be {verb}"
    elif code == scripts.NO_DIRECTORY:
        text = f"Cannot {verb} {path}: a parent is not a directory"
    else:
        text = f"Cannot {verb} {path}: {err.text().strip() or f'exit {code}'}"
    return ToolResult(exit_code=1, stdout="", stderr=text)


def _path_arg(call: ToolCall) -> str:
    path = call.args.get("path")
    if not isinstance(path, str):
        raise _InvalidCall(f"Invalid arguments for {call.type}: 'path' must be a str")
    try:
        return safe_relative_path(path)
    except ValueError as exc:
        prefix = f"unsafe path {path!r}: "
        raise _InvalidCall(f"Unsafe path: {path}: {str(exc).removeprefix(prefix)}") from None


def _shell_args(call: ToolCall) -> tuple[str, float | None, str | None, dict[str, str]]:
    args = call.args
    unexpected = sorted(set(args) - {"command", "timeout", "cwd", "env"})
    if unexpected:
        raise _InvalidCall(f"Invalid arguments for shell: unexpected argument(s) {', '.join(map(repr, unexpected))}")
    command = args.get("command")
    if not isinstance(command, str) or not command:
        raise _InvalidCall("Invalid arguments for shell: 'command' must be a non-empty string")
    timeout = args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
                                or timeout == float("inf")):
        raise _InvalidCall("Invalid arguments for shell: 'timeout' must be a positive number of seconds")
    cwd = args.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str):
            raise _InvalidCall("Invalid arguments for shell: 'cwd' must be a str")
        try:
            cwd = safe_relative_path(cwd)
        except ValueError as exc:
            raise _InvalidCall(f"Unsafe path: {cwd}: {str(exc).removeprefix(f'unsafe path {cwd!r}: ')}") from None
    env = args.get("env") or {}
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str) and "\0" not in v
            for k, v in env.items()):
        raise _InvalidCall("Invalid arguments for shell: 'env' must map variable names to strings")
    return command, (float(timeout) if timeout is not None else None), cwd, env
