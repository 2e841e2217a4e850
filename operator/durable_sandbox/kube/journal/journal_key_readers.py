"""Who else may read the journal key: checked when the operator starts, as far as it can be.

Whoever reads the key (``kube/journal/journal_key.py``) can forge journal values, so the operator refuses to start when:

1. the key's namespace is one it serves (``-n``): Workflow authors there usually hold the ``edit`` role, and
   ``edit`` reads every Secret of its namespace (always checked: it needs no API call);
2. a subject of a RoleBinding in the key's namespace, other than the operator itself, may ``get`` the key's Secret
   (a SubjectAccessReview per subject). This needs ``list`` on RoleBindings there and ``create`` on
   SubjectAccessReviews, which an operator run with an administrator's kubeconfig has and the chart does not
   grant; without them the check is skipped and the start-up log says so.

Not checked: ClusterRoleBindings (a cluster-wide reader of Secrets, such as ``cluster-admin``, already reads
everything the operator holds), and who may create Pods that mount the Secret, or edit the operator's Deployment
(as good as its own rights, see docs/guarantees.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.aio import client as k8s

from durable_sandbox.kube.api.client import ApiException, KubeClient

__all__ = ["ApiQuestions", "KeyReaders", "Subject", "key_readers", "readers_of", "readers_problem",
           "served_namespace_problem"]


@dataclass(frozen=True)
class Subject:
    """A RoleBinding's subject: ``User``, ``Group`` or ``ServiceAccount`` (``namespace`` for the last)."""

    kind: str
    name: str
    namespace: str = ""

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}" if self.kind == "ServiceAccount" else self.name

    def __str__(self) -> str:
        return f"{self.kind} {self.username}"


class KeyReaders(Protocol):
    """The questions the check asks the API server (:class:`ApiQuestions`; a fake in the unit tests). Each may raise
    :class:`PermissionError` when the operator may not ask it."""

    async def own_username(self) -> str: ...
    async def binding_subjects(self, namespace: str) -> list[Subject]: ...
    async def may_get_secret(self, subject: Subject, namespace: str, name: str) -> bool: ...


def served_namespace_problem(namespace: str, name: str, served: Sequence[str]) -> str | None:
    """Check 1: the key in a namespace this operator serves."""
    if namespace not in served:
        return None
    return (f"The journal key's Secret {namespace}/{name} is in namespace {namespace}, which this operator serves "
            f"(-n): whoever may create Workflows there usually holds the edit role, which reads its Secrets, and "
            f"could forge journal values. Keep the key in a namespace of the operator's own: "
            f"--journal-key-secret NAMESPACE/NAME (the chart uses its release namespace).")


async def key_readers(questions: KeyReaders, namespace: str, name: str) -> list[Subject] | None:
    """Check 2: the subjects of the namespace's RoleBindings, other than the operator, that may get the Secret
    (None: the operator may not ask)."""
    try:
        own = await questions.own_username()
        subjects = await questions.binding_subjects(namespace)
        found: list[Subject] = []
        for subject in dict.fromkeys(subjects):  # each subject once, in the order the bindings name them
            if subject.username != own and await questions.may_get_secret(subject, namespace, name):
                found.append(subject)
        return found
    except PermissionError:
        return None


async def readers_of(namespace: str, name: str, *, kubeconfig: str | None = None) -> list[Subject] | None:
    """:func:`key_readers` with a client of its own."""
    async with await KubeClient.connect(kubeconfig=kubeconfig) as api:
        return await key_readers(ApiQuestions(api), namespace, name)


def readers_problem(namespace: str, name: str, readers: Sequence[Subject]) -> str:
    return (f"The journal key's Secret {namespace}/{name} can be read by {', '.join(map(str, readers))} (a RoleBinding "
            f"in namespace {namespace}): whoever reads it can forge journal values. Remove their right to read "
            f"Secrets there, or keep the key in a namespace only the operator's administrators can read: "
            f"--journal-key-secret NAMESPACE/NAME.")


class ApiQuestions:
    """:class:`KeyReaders` over the API server."""

    def __init__(self, api: KubeClient) -> None:
        self._rbac = k8s.RbacAuthorizationV1Api(api.api_client)
        self._authz = k8s.AuthorizationV1Api(api.api_client)
        self._authn = k8s.AuthenticationV1Api(api.api_client)

    async def own_username(self) -> str:
        review: Any = await _asking(self._authn.create_self_subject_review(k8s.V1SelfSubjectReview()))
        return str(review.status.user_info.username)

    async def binding_subjects(self, namespace: str) -> list[Subject]:
        bindings: Any = await _asking(self._rbac.list_namespaced_role_binding(namespace))
        return [Subject(s.kind, s.name, (s.namespace or namespace) if s.kind == "ServiceAccount" else "")
                for binding in bindings.items for s in (binding.subjects or [])]

    async def may_get_secret(self, subject: Subject, namespace: str, name: str) -> bool:
        if subject.kind == "Group":
            who: dict[str, Any] = {"groups": [subject.name]}
        elif subject.kind == "ServiceAccount":
            who = {"user": subject.username, "groups": ["system:serviceaccounts",
                                                         f"system:serviceaccounts:{subject.namespace}",
                                                         "system:authenticated"]}
        else:
            who = {"user": subject.name, "groups": ["system:authenticated"]}
        spec = k8s.V1SubjectAccessReviewSpec(**who, resource_attributes=k8s.V1ResourceAttributes(
            namespace=namespace, verb="get", resource="secrets", name=name))
        review: Any = await _asking(self._authz.create_subject_access_review(k8s.V1SubjectAccessReview(spec=spec)))
        return bool(review.status.allowed)


async def _asking(call: Any) -> Any:
    """A question's answer; :class:`PermissionError` when the operator may not ask it (403), or the API server
    does not serve it (404: SelfSubjectReview before Kubernetes 1.28)."""
    try:
        return await call
    except ApiException as exc:
        if exc.status in (403, 404):
            raise PermissionError(f"{exc.status} {exc.reason}") from None
        raise
