"""Authentication and authorization of session calls with the caller's own Kubernetes credentials.

The bearer token is checked with a TokenReview (a ServiceAccount's token, or a user's the API server accepts),
then the user it names is asked about with a SubjectAccessReview for ``create sandboxes/calls`` on the Sandbox in
its namespace: a Role grants it like any other right (the chart ships the ClusterRole
``durable-sandbox-sandbox-caller`` to bind). The token itself is never logged, stored or put in an error.
"""

from __future__ import annotations

from kubernetes.aio import client as k8s

from durable_sandbox.kube.client import KubeClient
from durable_sandbox.kube.resources import GROUP
from durable_sandbox.sessions.errors import CallRefused

__all__ = ["CALLS_SUBRESOURCE", "KubeAuthorizer"]

CALLS_SUBRESOURCE = "calls"  # the permission: create sandboxes/calls


class KubeAuthorizer:
    def __init__(self, api: KubeClient) -> None:
        self.authn = k8s.AuthenticationV1Api(api.api_client)
        self.authz = k8s.AuthorizationV1Api(api.api_client)

    async def check(self, token: str | None, namespace: str, name: str) -> str:
        where = f"Sandbox {namespace}/{name}"
        if not token:
            raise CallRefused(401, "no bearer token in the request", where=f"{where}, Authorization header",
                              do="send 'Authorization: Bearer <token>' with a Kubernetes token (a ServiceAccount's, "
                              "or your kubeconfig's); durable_sandbox.client does it for you")
        review = await self.authn.create_token_review(k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(token=token)))
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            raise CallRefused(401, "the bearer token was not accepted by the API server (TokenReview)",
                              where=f"{where}, Authorization header",
                              do="send a current token (kubectl create token <serviceaccount> makes one)")
        user = status.user
        spec = k8s.V1SubjectAccessReviewSpec(
            user=user.username, groups=user.groups or [], uid=user.uid,
            extra={k: list(v) for k, v in (user.extra or {}).items()},
            resource_attributes=k8s.V1ResourceAttributes(namespace=namespace, verb="create", group=GROUP,
                                                         resource="sandboxes", subresource=CALLS_SUBRESOURCE, name=name))
        access = await self.authz.create_subject_access_review(k8s.V1SubjectAccessReview(spec=spec))
        if access.status is None or not access.status.allowed:
            raise CallRefused(403, f"{user.username} may not call this Sandbox (create sandboxes/calls)", where=where,
                              do=f"bind the ClusterRole durable-sandbox-sandbox-caller (or a Role granting create on "
                              f"sandboxes/calls) to {user.username} in namespace {namespace}")
        return str(user.username)
