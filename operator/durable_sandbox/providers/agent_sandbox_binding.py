"""Which Pod a sandbox of the ``agent-sandbox`` provider is: from the SandboxClaim the provider recorded, never
from labels (issue 37; the provider itself is not written yet: this is its identity rule, on its own).

A sandbox of that provider is a SandboxClaim of kubernetes-sigs/agent-sandbox (v1.0.1). Its controllers make the
chain the provider follows: the claim's ``status.sandbox.name`` names a Sandbox whose controller reference is the
claim (set when the claim adopts a warm Sandbox or creates one), and that Sandbox's Pod (annotation
``agents.x-k8s.io/pod-name``, else the Sandbox's own name) has the Sandbox as its controller reference. Anyone who
may edit Pods in the namespace can delete that Pod and make another of the same name, owner references included,
so the chain alone is not identity: the provider records the claim's name and uid when it creates the claim and the
Pod's uid the first time the claim is Ready, and every later call must find those same uids. A claim deleted or
re-created, a claim its controller expired, a Sandbox or Pod gone or replaced is :class:`SandboxGone` (recovery
restores and replays); a chain that leads elsewhere is refused the same way, with what was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable_sandbox.providers.contract import ProviderError, SandboxGone

__all__ = ["CLAIM_EXPIRED", "POD_NAME_ANNOTATION", "ClaimRecord", "NotReadyYet", "PodBinding", "bind_pod"]

# sigs.k8s.io/agent-sandbox v1.0.1: api/v1beta1 SandboxPodNameAnnotation, extensions/api/v1beta1 ClaimExpiredReason.
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
CLAIM_EXPIRED = "ClaimExpired"


class NotReadyYet(ProviderError):
    """The claim has no Ready sandbox yet (its controller is still working): wait and ask again."""

    retryable = True


@dataclass(frozen=True)
class ClaimRecord:
    """What the provider recorded: the claim it made (name, uid) and, once bound, its Pod's uid."""

    namespace: str
    claim: str
    claim_uid: str
    pod_uid: str | None = None

    @property
    def sandbox_id(self) -> str:
        return f"{self.namespace}/{self.claim}"


@dataclass(frozen=True)
class PodBinding:
    """The Pod calls go to: its name and uid (the uid to record on first binding)."""

    name: str
    uid: str


def _controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("uid"))
    return None


def _ready(claim: Mapping[str, Any]) -> tuple[str, str]:
    for condition in claim.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("status")), str(condition.get("reason", ""))
    return "Unknown", ""


def bind_pod(record: ClaimRecord, claim: Mapping[str, Any] | None, sandbox: Mapping[str, Any] | None,
             pod: Mapping[str, Any] | None) -> PodBinding:
    """The Pod of ``record``'s claim, given the claim, its Sandbox and that Pod as read (None: not found).

    Raises :class:`SandboxGone` when the recorded claim or Pod no longer exists or the chain leads to objects that
    are not the recorded ones, :class:`NotReadyYet` while the claim's controller has not bound it yet."""
    sid = record.sandbox_id
    if claim is None:
        raise SandboxGone(sid, f"its SandboxClaim {record.claim} was deleted")
    if claim.get("metadata", {}).get("uid") != record.claim_uid:
        raise SandboxGone(sid, f"SandboxClaim {record.claim} was deleted and made again (uid "
                               f"{claim.get('metadata', {}).get('uid')}, recorded {record.claim_uid})")
    status, reason = _ready(claim)
    if reason == CLAIM_EXPIRED:
        raise SandboxGone(sid, f"its SandboxClaim expired ({reason}): agent-sandbox's controller ended it")
    sandbox_name = (claim.get("status", {}).get("sandbox") or {}).get("name")
    if status != "True" or not sandbox_name:
        if record.pod_uid is not None:
            raise SandboxGone(sid, f"its SandboxClaim is no longer Ready (Ready={status}, reason {reason or 'none'})")
        raise NotReadyYet(f"sandbox {sid}: its SandboxClaim is not Ready yet (Ready={status}, reason "
                          f"{reason or 'none'}); agent-sandbox's controller binds it")
    if sandbox is None:
        raise SandboxGone(sid, f"its Sandbox {sandbox_name} was deleted")
    if _controller(sandbox) != ("SandboxClaim", record.claim_uid):
        raise SandboxGone(sid, f"Sandbox {sandbox_name} is not controlled by the recorded SandboxClaim "
                               f"(uid {record.claim_uid}): refused")
    pod_name = str((sandbox.get("metadata", {}).get("annotations") or {}).get(POD_NAME_ANNOTATION) or sandbox_name)
    if pod is None:
        raise SandboxGone(sid, f"its Pod {pod_name} was deleted")
    pod_uid = str(pod.get("metadata", {}).get("uid"))
    if _controller(pod) != ("Sandbox", str(sandbox.get("metadata", {}).get("uid"))):
        raise SandboxGone(sid, f"Pod {pod_name} is not controlled by Sandbox {sandbox_name}: refused")
    if record.pod_uid is not None and pod_uid != record.pod_uid:
        raise SandboxGone(sid, f"its Pod {pod_name} was replaced (uid {pod_uid}, recorded {record.pod_uid}): "
                               "the workspace in it is not the sandbox's")
    return PodBinding(name=pod_name, uid=pod_uid)
