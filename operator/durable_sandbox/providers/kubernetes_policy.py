"""What a ``kubernetes`` sandbox's template may ask for: an allow-list, checked at every provision.

A sandbox runs code nobody trusts, and its template may come from a PodTemplate that whoever may edit the
namespace's objects wrote. So every volume type, security field and Pod-level setting the checks below do not
know is refused, naming the field, unless the operator's configuration (:class:`TemplatePolicy`:
``DSB_K8S_POLICY``, the chart's ``providers.kubernetes.allow``) names it. What is allowed without any
configuration: volumes of type emptyDir, configMap, downwardAPI, persistentVolumeClaim, and projected volumes of
configMap and downwardAPI sources (none of them carries a credential of the cluster); a non-root user; seccomp
and AppArmor ``RuntimeDefault`` or ``Localhost`` profiles; an SELinux ``level``; ``readOnlyRootFilesystem``.
docs/providers.md's policy table lists every field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from pydantic import Field

from durable_sandbox.providers.kubernetes_settings import SettingModel, from_environ

__all__ = ["ENV_POLICY", "AskedPod", "TemplatePolicy", "policy_problems"]

ENV_POLICY = "DSB_K8S_POLICY"
ALLOWED_VOLUME_TYPES = frozenset({"emptyDir", "configMap", "downwardAPI", "persistentVolumeClaim", "projected"})
ALLOWED_PROJECTED_SOURCES = frozenset({"configMap", "downwardAPI"})
_CREDENTIAL_VOLUMES: Final[Mapping[str, str]] = {"secret": "it puts a Secret in the sandbox",
                       "serviceAccountToken": "it puts a token of the cluster in the sandbox",
                       "hostPath": "host paths are refused"}
CONTAINER_SECURITY_FIELDS = frozenset({
    "runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation", "capabilities", "seccompProfile",
    "appArmorProfile", "seLinuxOptions", "readOnlyRootFilesystem", "privileged", "procMount"})
POD_SECURITY_FIELDS = frozenset({
    "fsGroup", "fsGroupChangePolicy", "runAsUser", "runAsGroup", "runAsNonRoot", "supplementalGroups",
    "supplementalGroupsPolicy", "seccompProfile", "appArmorProfile", "seLinuxOptions", "seLinuxChangePolicy",
    "sysctls"})
_CONFINED_PROFILES = ("RuntimeDefault", "Localhost")
# Annotations that set a profile where the fields above do not (older clusters read them).
_PROFILE_ANNOTATIONS = ("container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/",
                        "container.seccomp.security.alpha.kubernetes.io/")


class TemplatePolicy(SettingModel):
    """What the operator's configuration allows a template to ask for beyond the allow-list (``DSB_K8S_POLICY``;
    the chart's ``providers.kubernetes.allow``). Nothing is allowed beyond it by default."""

    privileged: bool = False  # privileged, escalation, unconfined profiles, procMount, sysctls, fewer dropped caps
    host_namespaces: bool = Field(default=False, alias="hostNamespaces")
    host_path: bool = Field(default=False, alias="hostPath")
    run_as_root: bool = Field(default=False, alias="runAsRoot")  # user or group 0, runAsNonRoot: false
    capabilities: frozenset[str] = frozenset()  # capabilities a template may add
    volume_types: frozenset[str] = Field(default=frozenset(), alias="volumeTypes")  # and projected sources
    se_linux_types: frozenset[str] = Field(default=frozenset(), alias="seLinuxTypes")
    service_accounts: frozenset[str] = Field(default=frozenset(), alias="serviceAccounts")  # the operator's template
    runtime_classes: frozenset[str] | None = Field(default=None, alias="runtimeClasses")  # None: any

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TemplatePolicy:
        return from_environ(cls, ENV_POLICY, "policy", environ)


class AskedPod(Protocol):
    """The parts of a template the policy looks at (``kubernetes_template.PodTemplate`` has them)."""

    @property
    def security_context(self) -> dict[str, Any]: ...
    @property
    def pod_security_context(self) -> dict[str, Any]: ...
    @property
    def host_network(self) -> bool: ...
    @property
    def host_pid(self) -> bool: ...
    @property
    def host_ipc(self) -> bool: ...
    @property
    def volumes(self) -> tuple[dict[str, Any], ...]: ...
    @property
    def volume_mounts(self) -> tuple[dict[str, Any], ...]: ...
    @property
    def service_account_name(self) -> str | None: ...
    @property
    def runtime_class_name(self) -> str | None: ...
    @property
    def annotations(self) -> dict[str, str]: ...


def policy_problems(asked: AskedPod, policy: TemplatePolicy) -> list[str]:
    """What ``asked`` asks for that ``policy`` does not allow, one line each: the field, what is refused, and the
    setting of ``providers.kubernetes.allow`` that would allow it (if any does)."""
    sc, psc = asked.security_context, asked.pod_security_context
    return [
        *_unknown_fields("securityContext", sc, CONTAINER_SECURITY_FIELDS),
        *_unknown_fields("podSecurityContext", psc, POD_SECURITY_FIELDS),
        *_privilege_problems(sc, policy),
        *_confinement_problems("securityContext", sc, policy),
        *_confinement_problems("podSecurityContext", psc, policy),
        *_sysctl_problems(psc, policy),
        *_user_problems("securityContext", sc, policy),
        *_user_problems("podSecurityContext", psc, policy),
        *_host_problems(asked, policy),
        *_volume_problems(asked.volumes, policy),
        *_mount_problems(asked.volume_mounts, policy),
        *_identity_problems(asked, policy),
        *_annotation_problems(asked.annotations, policy),
    ]


def _unknown_fields(where: str, context: Mapping[str, Any], known: frozenset[str]) -> list[str]:
    return [f"{where}.{key}: not a field the policy allows (windowsOptions, or one it does not know); remove it"
            for key in sorted(set(context) - known)]


def _privilege_problems(sc: Mapping[str, Any], policy: TemplatePolicy) -> list[str]:
    out: list[str] = []
    if not policy.privileged:
        if sc.get("privileged"):
            out.append("securityContext.privileged: a privileged container is refused (allow: privileged)")
        if sc.get("allowPrivilegeEscalation"):
            out.append("securityContext.allowPrivilegeEscalation: privilege escalation is refused (allow: privileged)")
        if sc.get("procMount") not in (None, "Default"):
            out.append("securityContext.procMount: an unmasked /proc is refused (allow: privileged)")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            out.append("securityContext.capabilities.drop: must drop ALL (add back what is allowed with "
                       "capabilities.add) (allow: privileged)")
    added = set((sc.get("capabilities") or {}).get("add") or [])
    refused = sorted(added - set(policy.capabilities))
    if refused:
        out.append(f"securityContext.capabilities.add: adding {', '.join(refused)} is refused "
                   f"(allow: capabilities: [{', '.join(refused)}])")
    return out


def _confinement_problems(where: str, sc: Mapping[str, Any], policy: TemplatePolicy) -> list[str]:
    """seccomp, AppArmor and SELinux: the runtime's confinement stays on."""
    out: list[str] = []
    if not policy.privileged:
        for key, name in (("seccompProfile", "seccomp"), ("appArmorProfile", "AppArmor")):
            kind = (sc.get(key) or {}).get("type")
            if kind is not None and kind not in _CONFINED_PROFILES:
                out.append(f"{where}.{key}: {name} profile {kind!r} is refused, only RuntimeDefault or Localhost "
                           f"(allow: privileged)")
        selinux = sc.get("seLinuxOptions") or {}
        for key in ("user", "role"):
            if selinux.get(key):
                out.append(f"{where}.seLinuxOptions.{key}: refused, only type and level (allow: privileged)")
    kind = (sc.get("seLinuxOptions") or {}).get("type")
    if kind and kind not in policy.se_linux_types:
        out.append(f"{where}.seLinuxOptions.type: SELinux type {kind!r} is refused (spc_t runs unconfined) "
                   f"(allow: seLinuxTypes: [{kind}])")
    return out


def _sysctl_problems(psc: Mapping[str, Any], policy: TemplatePolicy) -> list[str]:
    sysctls = psc.get("sysctls") or []
    if not sysctls or policy.privileged:
        return []
    names = ", ".join(str(s.get("name")) for s in sysctls if isinstance(s, Mapping))
    return [f"podSecurityContext.sysctls: refused ({names}) (allow: privileged)"]


def _user_problems(where: str, sc: Mapping[str, Any], policy: TemplatePolicy) -> list[str]:
    if policy.run_as_root:
        return []
    out = [f"{where}.{key}: 0 (root) is refused; use another id (allow: runAsRoot)"
           for key in ("runAsUser", "runAsGroup") if sc.get(key) == 0]
    if sc.get("runAsNonRoot") is False:
        out.append(f"{where}.runAsNonRoot: false is refused (allow: runAsRoot)")
    return out


def _host_problems(asked: AskedPod, policy: TemplatePolicy) -> list[str]:
    if policy.host_namespaces:
        return []
    asked_for = (("hostNetwork", asked.host_network), ("hostPID", asked.host_pid), ("hostIPC", asked.host_ipc))
    return [f"{key}: the host's namespaces are refused (allow: hostNamespaces)" for key, value in asked_for if value]


def _volume_problems(volumes: tuple[dict[str, Any], ...], policy: TemplatePolicy) -> list[str]:
    allowed = ALLOWED_VOLUME_TYPES | policy.volume_types | ({"hostPath"} if policy.host_path else set())
    out: list[str] = []
    for volume in volumes:
        name = volume.get("name", "?")
        kinds = sorted(set(volume) - {"name"})
        if len(kinds) != 1:
            out.append(f"volumes[{name}]: needs exactly one volume type, has {', '.join(kinds) or 'none'}")
            continue
        kind = kinds[0]
        if kind not in allowed:
            out.append(f"volumes[{name}].{kind}: {_refused_type(kind)}")
        elif kind == "projected":
            sources = (volume.get("projected") or {}).get("sources") or []
            for i, source in enumerate(sources):
                for source_kind in sorted(set(source) - ALLOWED_PROJECTED_SOURCES - policy.volume_types):
                    out.append(f"volumes[{name}].projected.sources[{i}].{source_kind}: {_refused_type(source_kind)}")
    return out


def _refused_type(kind: str) -> str:
    why = _CREDENTIAL_VOLUMES.get(kind, "not a volume type the policy allows")
    allow = "hostPath" if kind == "hostPath" else f"volumeTypes: [{kind}]"
    return f"a {kind} volume is refused: {why} (allow: {allow})"


def _mount_problems(mounts: tuple[dict[str, Any], ...], policy: TemplatePolicy) -> list[str]:
    if policy.privileged:
        return []
    return [f"volumeMounts[{mount.get('name', '?')}].mountPropagation: {mount['mountPropagation']} is refused "
            f"(allow: privileged)"
            for mount in mounts if mount.get("mountPropagation") not in (None, "None")]


def _identity_problems(asked: AskedPod, policy: TemplatePolicy) -> list[str]:
    out: list[str] = []
    if asked.service_account_name is not None and asked.service_account_name not in policy.service_accounts:
        out.append(f"serviceAccountName: service account {asked.service_account_name!r} is refused (a sandbox runs "
                   f"as the namespace's default, without a token) (allow: serviceAccounts: "
                   f"[{asked.service_account_name}], for the operator's own template)")
    if (asked.runtime_class_name is not None and policy.runtime_classes is not None
            and asked.runtime_class_name not in policy.runtime_classes):
        out.append(f"runtimeClassName: {asked.runtime_class_name!r} is not one the operator allows "
                   f"({', '.join(sorted(policy.runtime_classes)) or 'none'}) (allow: runtimeClasses)")
    return out


def _annotation_problems(annotations: Mapping[str, str], policy: TemplatePolicy) -> list[str]:
    if policy.privileged:
        return []
    return [f"annotations.{key}: {value!r} is refused, only runtime/default or localhost/ profiles (allow: privileged)"
            for key, value in sorted(annotations.items())
            if key.startswith(_PROFILE_ANNOTATIONS) and not str(value).startswith(("runtime/default", "localhost/"))
            and str(value) != "docker/default"]
