"""Authentication and authorization of session calls with the caller's own Kubernetes credentials.

The bearer token is checked with a TokenReview (a ServiceAccount's token, or a user's the API server accepts),
then the user it names is asked about with a SubjectAccessReview for ``create sandboxes/calls`` on the Sandbox in
its namespace: a Role grants it like any other right (the chart ships the ClusterRole
``durable-sandbox-sandbox-caller`` to bind). The token itself is never logged, stored or put in an error.

An allowed caller is remembered for ``CACHE_SECONDS`` (by a digest of its token, never the token, and the Sandbox),
so an agent's run of calls costs the API server two reviews every few seconds, not two per call (the token's user
is remembered alone too, so an agent calling many Sandboxes costs one TokenReview, and a SubjectAccessReview per
Sandbox); a refusal is never
remembered (a right just granted works at once), and a right taken away stops working within those seconds (the
API server's own webhook authorizer caches an allow for minutes).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client as k8s

from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.api.resources import GROUP
from durable_sandbox.sessions.errors import CallRefused

__all__ = ["CALLS_SUBRESOURCE", "KubeAuthorizer"]

CALLS_SUBRESOURCE = "calls"  # the permission: create sandboxes/calls


@dataclass(frozen=True)
class AccessRight:
    verb: str
    subresource: str | None
    what: str  # for the refusal: what the caller may not do
    role: str  # the chart's ClusterRole granting it

    def __str__(self) -> str:
        return f"{self.verb} sandboxes" + (f"/{self.subresource}" if self.subresource else "")


CALLS = AccessRight("create", CALLS_SUBRESOURCE, "call this Sandbox", "durable-sandbox-sandbox-caller")
UPDATE = AccessRight("update", None, "rewind this Sandbox's session", "durable-sandbox-sandbox-owner")
CACHE_SECONDS = 10.0
CACHE_ENTRIES = 1024


class KubeAuthorizer:
    def __init__(self, api: KubeClient | None, *, authn: Any = None, authz: Any = None,
                 cache_seconds: float = CACHE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.authn = authn or k8s.AuthenticationV1Api(api.api_client if api is not None else None)
        self.authz = authz or k8s.AuthorizationV1Api(api.api_client if api is not None else None)
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._allowed: OrderedDict[tuple[str, str, str, str], tuple[str, float]] = OrderedDict()  # -> (user, until)
        self._users: OrderedDict[str, tuple[Any, float]] = OrderedDict()  # token digest -> (TokenReview user, until)

    async def check(self, token: str | None, namespace: str, name: str) -> str:
        return await self._check(token, namespace, name, CALLS)

    async def check_update(self, token: str | None, namespace: str, name: str) -> str:
        """Who may rewind the Sandbox's session: ``update sandboxes`` (who may write its spec), not only call it."""
        return await self._check(token, namespace, name, UPDATE)

    async def _check(self, token: str | None, namespace: str, name: str, right: AccessRight) -> str:
        where = f"Sandbox {namespace}/{name}"
        if not token:
            raise CallRefused(401, "no bearer token in the request", where=f"{where}, Authorization header",
                              do="send 'Authorization: Bearer <token>' with a Kubernetes token (a ServiceAccount's, "
                              "or your kubeconfig's); durable_sandbox.client does it for you")
        digest = hashlib.sha256(token.encode()).hexdigest()
        key = (digest, namespace, name, right.verb)
        known = self._allowed.get(key)
        if known is not None and known[1] > self.clock():
            return known[0]
        user = await self._user(token, digest, where)
        username = await self._access(user, namespace, name, where, right)
        _remember(self._allowed, key, (username, self.clock() + self.cache_seconds))
        return username

    async def check_workflow(self, token: str | None, namespace: str, name: str, verb: str) -> str:
        """The caller's user name if it may ``verb`` (``get`` for a query, ``update`` for an update) the Workflow
        ``name`` in ``namespace`` (engine/updates.py through sessions/workflow_calls.py); CallRefused otherwise."""
        where = f"Workflow {namespace}/{name}"
        if not token:
            raise CallRefused(401, "no bearer token in the request", where=f"{where}, Authorization header",
                              do="send 'Authorization: Bearer <token>' with a Kubernetes token (a ServiceAccount's, "
                              "or your kubeconfig's)")
        digest = hashlib.sha256(token.encode()).hexdigest()
        key = (digest, namespace, f"workflows/{name}", verb)  # never a Sandbox's key: names have no '/'
        known = self._allowed.get(key)
        if known is not None and known[1] > self.clock():
            return known[0]
        user = await self._user(token, digest, where)
        attributes = k8s.V1ResourceAttributes(namespace=namespace, verb=verb, group=GROUP, resource="workflows",
                                              name=name)
        if not await self._allowed_by_review(user, attributes):
            raise CallRefused(403, f"{user.username} may not {verb} this Workflow ({verb} workflows)", where=where,
                              do=f"grant {verb} on workflows.{GROUP} in namespace {namespace} to {user.username} "
                              f"(a Role and RoleBinding)")
        _remember(self._allowed, key, (str(user.username), self.clock() + self.cache_seconds))
        return str(user.username)

    async def _allowed_by_review(self, user: Any, attributes: Any) -> bool:
        spec = k8s.V1SubjectAccessReviewSpec(
            user=user.username, groups=user.groups or [], uid=user.uid,
            extra={k: list(v) for k, v in (user.extra or {}).items()}, resource_attributes=attributes)
        access = await self.authz.create_subject_access_review(k8s.V1SubjectAccessReview(spec=spec))
        return access.status is not None and bool(access.status.allowed)

    async def _user(self, token: str, digest: str, where: str) -> Any:
        """Who the token names: a TokenReview, remembered (by the token's digest) as an allow is, so one agent
        calling several Sandboxes costs one review per token, not one per Sandbox."""
        known = self._users.get(digest)
        if known is not None and known[1] > self.clock():
            return known[0]
        review = await self.authn.create_token_review(k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(token=token)))
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            raise CallRefused(401, "the bearer token was not accepted by the API server (TokenReview)",
                              where=f"{where}, Authorization header",
                              do="send a current token (kubectl create token <serviceaccount> makes one)")
        _remember(self._users, digest, (status.user, self.clock() + self.cache_seconds))
        return status.user

    async def _access(self, user: Any, namespace: str, name: str, where: str, right: AccessRight) -> str:
        attributes = k8s.V1ResourceAttributes(namespace=namespace, verb=right.verb, group=GROUP, resource="sandboxes",
                                              subresource=right.subresource, name=name)
        if not await self._allowed_by_review(user, attributes):
            raise CallRefused(403, f"{user.username} may not {right.what} ({right})",
                              where=where, do=f"bind the ClusterRole {right.role} (or a Role granting {right}) to "
                              f"{user.username} in namespace {namespace}")
        return str(user.username)


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_ENTRIES:
        cache.popitem(last=False)
