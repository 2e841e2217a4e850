"""What a ``kubernetes`` sandbox's Pod is made of, where that comes from, and what is refused.

Three sources, each layered over the one before:

1. **The operator's default** (``DSB_K8S_TEMPLATE``: JSON of a :class:`PodTemplate`, set by the chart from
   ``providers.kubernetes.template`` in its values); without one, :data:`DEFAULT_IMAGE` and the defaults below.
2. **A PodTemplate object** in the sandbox's namespace, named by the Workflow's (or Sandbox's) ``template`` as
   ``podtemplate/<name>``: its ``template.spec`` (one container) and labels, read through :meth:`PodTemplate.from_pod_template`.
3. **The template string** otherwise: an image reference that replaces the default's image.

Whatever the source, :meth:`PodTemplate.problems` checks the result against the operator's :class:`TemplatePolicy`
(``providers/kubernetes_policy.py``): an allow-list of volume types and security fields; anything else is refused
with an error that names the field, unless the operator's configuration allows that exact thing. What no source
can change: the workspace volume's mount, the keep-alive command's role (it must keep the container alive),
``automountServiceAccountToken: false`` (the sandbox runs untrusted code; no credential of the cluster goes into
it: a PodTemplate asking for a token, or naming a service account, is refused), ``restartPolicy: Never`` (a dead
sandbox is lost, and recovered from its snapshot, never silently restarted with its files), and the operator's
labels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import Field, ValidationError, field_validator

from durable_sandbox.providers.contract import ProvisionError
from durable_sandbox.providers.kubernetes_policy import TemplatePolicy, policy_problems
from durable_sandbox.providers.kubernetes_settings import SettingModel, describe_errors, from_environ

__all__ = [
    "DEFAULT_IMAGE",
    "WORKSPACE",
    "PodTemplate",
    "TemplatePolicy",
    "WorkspaceVolume",
    "pod_template_reference",
]

DEFAULT_IMAGE = "docker.io/library/busybox:1.36"
WORKSPACE = "/workspace"  # the workspace volume's mount: the shell's cwd and $HOME, what snapshots hold
CONTAINER = "sandbox"
# Sleeps in the background and waits, so SIGTERM (Pod deletion) ends it at once instead of after the grace period.
KEEP_ALIVE: Final[Sequence[str]] = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
POD_TEMPLATE_PREFIX = "podtemplate/"
ENV_TEMPLATE = "DSB_K8S_TEMPLATE"
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class WorkspaceVolume(SettingModel):
    """The volume mounted at :data:`WORKSPACE`: an emptyDir with a size limit, or a PersistentVolumeClaim."""

    size_limit: str = Field(default="1Gi", alias="sizeLimit")
    medium: Literal["", "Memory"] = ""
    claim_name: str | None = Field(default=None, alias="claimName")  # a PVC the namespace already has (never deleted here)

    def volume(self) -> dict[str, Any]:
        if self.claim_name is not None:
            return {"name": "workspace", "persistentVolumeClaim": {"claimName": self.claim_name}}
        empty: dict[str, Any] = {"sizeLimit": self.size_limit}
        if self.medium:
            empty["medium"] = self.medium
        return {"name": "workspace", "emptyDir": empty}


RESTRICTED_SECURITY_CONTEXT: Final[Mapping[str, Any]] = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


class PodTemplate(SettingModel):
    """The parts of a Pod a sandbox template sets (camelCase as in a Pod spec)."""

    image: str = DEFAULT_IMAGE
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(default=None, alias="imagePullPolicy")
    image_pull_secrets: tuple[str, ...] = Field(default=(), alias="imagePullSecrets")
    command: tuple[str, ...] = Field(default=tuple(KEEP_ALIVE))
    resources: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}})
    runtime_class_name: str | None = Field(default=None, alias="runtimeClassName")
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: tuple[dict[str, Any], ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    workspace: WorkspaceVolume = Field(default_factory=lambda: WorkspaceVolume())
    security_context: dict[str, Any] = Field(default_factory=lambda: dict(RESTRICTED_SECURITY_CONTEXT),
                                             alias="securityContext")
    pod_security_context: dict[str, Any] = Field(default_factory=lambda: {"fsGroup": 1000},
                                                 alias="podSecurityContext")
    service_account_name: str | None = Field(default=None, alias="serviceAccountName")
    host_network: bool = Field(default=False, alias="hostNetwork")
    host_pid: bool = Field(default=False, alias="hostPID")
    host_ipc: bool = Field(default=False, alias="hostIPC")
    volumes: tuple[dict[str, Any], ...] = ()  # extra volumes (hostPath refused by policy)
    volume_mounts: tuple[dict[str, Any], ...] = Field(default=(), alias="volumeMounts")
    termination_grace_period_seconds: int = Field(default=5, alias="terminationGracePeriodSeconds", ge=0)
    # How long the Pod stays bound to a node that went away (not ready, unreachable) before the cluster evicts
    # it: a sandbox is recovered from its snapshot on a new Pod instead of waiting the cluster's default 300 s.
    node_lost_seconds: int = Field(default=30, alias="nodeLostSeconds", ge=0)

    @field_validator("security_context", mode="before")
    @classmethod
    def _over_restricted(cls, value: Any) -> Any:
        """A template's securityContext is laid over the restricted default, key by key (capabilities too),
        so asking for one thing (a user id) does not silently drop the rest (dropped capabilities, seccomp)."""
        if not isinstance(value, Mapping):
            return value
        merged = {**RESTRICTED_SECURITY_CONTEXT, **value}
        if isinstance(value.get("capabilities"), Mapping):
            merged["capabilities"] = {**RESTRICTED_SECURITY_CONTEXT["capabilities"], **value["capabilities"]}
        return merged

    # ------------------------------------------------------------------------------------- sources

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> PodTemplate:
        return from_environ(cls, ENV_TEMPLATE, "template", environ)

    def with_image(self, image: str) -> PodTemplate:
        if not image.strip() or any(ch.isspace() for ch in image):
            raise ProvisionError(f"template {image!r} is not an image reference (nor podtemplate/<name>)",
                                 retryable=False)
        return self.model_copy(update={"image": image})

    def from_pod_template(self, name: str, body: Mapping[str, Any]) -> PodTemplate:
        """This template overlaid with a PodTemplate object's ``template`` (its one container, its Pod spec
        fields this model has, its labels). Anything else in it is refused by name: silently dropping a field
        the author asked for would run something other than what they wrote."""
        where = f"PodTemplate {name}"
        template = body.get("template") or {}
        spec = dict(template.get("spec") or {})
        meta = template.get("metadata") or {}
        containers = spec.pop("containers", None) or []
        if len(containers) != 1:
            raise ProvisionError(f"{where}: needs exactly one container (the sandbox), has {len(containers)}",
                                 retryable=False)
        _refuse_identity(where, spec)
        container = dict(containers[0])
        container.pop("name", None)
        fields: dict[str, Any] = {}
        for key in ("image", "imagePullPolicy", "command", "resources", "securityContext", "volumeMounts"):
            if key in container:
                fields[key] = container.pop(key)
        for key in ("runtimeClassName", "nodeSelector", "tolerations", "hostNetwork", "hostPID", "hostIPC", "volumes",
                    "terminationGracePeriodSeconds"):
            if key in spec:
                fields[key] = spec.pop(key)
        if "securityContext" in spec:
            fields["podSecurityContext"] = spec.pop("securityContext")
        if "imagePullSecrets" in spec:
            fields["imagePullSecrets"] = [s.get("name") for s in spec.pop("imagePullSecrets") or []]
        for key, value in _SPEC_DEFAULTS.items():  # what the API server fills in: not the author's asking
            if spec.get(key) == value:
                spec.pop(key)
        for key, value in _CONTAINER_DEFAULTS.items():
            if container.get(key) == value:
                container.pop(key)
        spec.pop("restartPolicy", None)
        spec.pop("automountServiceAccountToken", None)  # false, or refused above: see the module docstring
        leftover = sorted([f"spec.{k}" for k in spec] + [f"containers[0].{k}" for k in container])
        if leftover:
            raise ProvisionError(f"{where}: the kubernetes provider does not support {', '.join(leftover)}; "
                                 f"remove them (see docs/providers.md, what a template may set)", retryable=False)
        if meta.get("labels"):
            fields["labels"] = {**self.labels, **meta["labels"]}
        merged = self.model_dump(by_alias=True)
        merged.update(fields)
        try:
            return PodTemplate.model_validate(merged)
        except ValidationError as exc:
            raise ProvisionError(f"{where}: {describe_errors(exc)}", retryable=False) from None

    # ------------------------------------------------------------------------------------- policy

    def problems(self, policy: TemplatePolicy) -> list[str]:
        """What this template asks for that ``policy`` does not allow, one line each, naming the field."""
        out = policy_problems(self, policy)
        for volume in self.volumes:
            if volume.get("name") == "workspace":
                out.append("volumes[workspace]: the name is the provider's own workspace volume")
        for mount in self.volume_mounts:
            if str(mount.get("mountPath", "")).rstrip("/") == WORKSPACE:
                out.append(f"volumeMounts: {WORKSPACE} is where the provider mounts the workspace")
        for section in ("requests", "limits"):
            for resource, quantity in (self.resources.get(section) or {}).items():
                if not _QUANTITY.match(str(quantity)):
                    out.append(f"resources.{section}.{resource}: {quantity!r} is not a quantity")
        unknown = sorted(set(self.resources) - {"requests", "limits"})
        if unknown:
            out.append(f"resources: only requests and limits, not {', '.join(unknown)}")
        if not self.command:
            out.append("command: the container needs a command that keeps it alive")
        for key in self.labels:
            if key.startswith("durable-sandbox.dev/"):
                out.append(f"labels.{key}: the durable-sandbox.dev/ labels are the operator's own")
        return out

    def check(self, policy: TemplatePolicy, *, source: str) -> PodTemplate:
        problems = self.problems(policy)
        if problems:
            raise ProvisionError(
                f"the sandbox template ({source}) asks for what the operator's configuration does not allow: "
                + "; ".join(problems) + ". Change the template, or have the operator's administrator allow it "
                "(the chart's providers.kubernetes.allow)", retryable=False)
        return self

    # ------------------------------------------------------------------------------------- the Pod

    def pod(self, *, name: str, namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str],
            env_secret: str | None) -> dict[str, Any]:
        """The Pod manifest (a plain dict, as the API takes it)."""
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": self.image,
            "command": list(self.command),
            "workingDir": WORKSPACE,
            "env": [{"name": "HOME", "value": WORKSPACE}],
            "resources": self.resources,
            "securityContext": self.security_context,
            "volumeMounts": [{"name": "workspace", "mountPath": WORKSPACE}, *self.volume_mounts],
        }
        if self.image_pull_policy:
            container["imagePullPolicy"] = self.image_pull_policy
        if env_secret is not None:
            # The sandbox's env (may hold secrets) lives in a Secret of its own, never in the Pod's spec.
            container["envFrom"] = [{"secretRef": {"name": env_secret}}]
        spec: dict[str, Any] = {
            "containers": [container],
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": self.termination_grace_period_seconds,
            "volumes": [self.workspace.volume(), *self.volumes],
            "securityContext": self.pod_security_context,
            "hostNetwork": self.host_network, "hostPID": self.host_pid, "hostIPC": self.host_ipc,
        }
        if self.service_account_name:
            spec["serviceAccountName"] = self.service_account_name
        if self.runtime_class_name:
            spec["runtimeClassName"] = self.runtime_class_name
        if self.node_selector:
            spec["nodeSelector"] = self.node_selector
        tolerations = list(self.tolerations)
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                    "tolerationSeconds": self.node_lost_seconds})
        spec["tolerations"] = tolerations
        if self.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": n} for n in self.image_pull_secrets]
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {**self.labels, **labels},
                         "annotations": {**self.annotations, **annotations}},
            "spec": spec,
        }


_SPEC_DEFAULTS: Final[Mapping[str, Any]] = {"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler"}
_CONTAINER_DEFAULTS: Final[Mapping[str, Any]] = {"terminationMessagePath": "/dev/termination-log",
                                       "terminationMessagePolicy": "File"}


def _refuse_identity(where: str, spec: Mapping[str, Any]) -> None:
    """A PodTemplate never chooses who the sandbox is to the cluster: whoever may edit PodTemplates could
    otherwise hand untrusted code a service account (a token a webhook injects, a cloud role bound to it)."""
    refused = [f"spec.{key}" for key in ("serviceAccountName", "serviceAccount") if spec.get(key)]
    if spec.get("automountServiceAccountToken"):
        refused.append("spec.automountServiceAccountToken")
    if refused:
        raise ProvisionError(
            f"{where}: {', '.join(refused)}: a sandbox runs as the namespace's default service account with no "
            f"token, whatever a PodTemplate says; remove them (only the operator's own template, "
            f"providers.kubernetes.template, may name a service account its policy allows)", retryable=False)


def pod_template_reference(template: str | None) -> str | None:
    """The PodTemplate object's name when ``template`` names one (``podtemplate/<name>``), else None."""
    if template is None or not template.startswith(POD_TEMPLATE_PREFIX):
        return None
    name = template[len(POD_TEMPLATE_PREFIX):]
    if not _DNS_LABEL.match(name) or len(name) > 253:
        raise ProvisionError(f"template {template!r}: {name!r} is not a PodTemplate name", retryable=False)
    return name


def dumps(template: PodTemplate) -> str:
    """A template as ``DSB_K8S_TEMPLATE`` holds it."""
    return json.dumps(template.model_dump(by_alias=True, exclude_defaults=True))
