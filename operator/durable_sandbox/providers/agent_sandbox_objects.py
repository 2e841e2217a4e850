"""The objects of kubernetes-sigs/agent-sandbox (v1.0.1) the ``agent-sandbox`` provider reads and writes, through
``kubernetes.aio``'s CustomObjectsApi: SandboxClaims (``extensions.agents.x-k8s.io``; created, patched, deleted by
uid, listed by label) and Sandboxes (``agents.x-k8s.io``; only read). Answers are plain JSON; a missing object is
None; every other API error is raised as the ApiException it is, for the provider to say what it means."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from durable_sandbox.providers.kubernetes_connection import api_body as json_body

__all__ = ["CLAIMS", "EXTENSIONS_GROUP", "SANDBOXES", "SANDBOX_GROUP", "VERSION", "AgentSandboxObjects",
           "ClaimObjects", "status_of"]

SANDBOX_GROUP = "agents.x-k8s.io"
EXTENSIONS_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
CLAIMS = "sandboxclaims"
SANDBOXES = "sandboxes"
_GROUPS: Final[Mapping[str, str]] = {CLAIMS: EXTENSIONS_GROUP, SANDBOXES: SANDBOX_GROUP}
MERGE_PATCH = "application/merge-patch+json"


def status_of(exc: BaseException) -> int | None:
    from kubernetes.aio.client.exceptions import ApiException

    return exc.status if isinstance(exc, ApiException) else None


class ClaimObjects(Protocol):
    """What the provider asks of the API server about agent-sandbox's objects (unit tests fake this)."""

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create(self, plural: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch(self, plural: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def delete(self, plural: str, namespace: str, name: str, *, uid: str) -> bool: ...

    async def list(self, plural: str, namespace: str, selector: str) -> list[dict[str, Any]]: ...


class AgentSandboxObjects:
    """:class:`ClaimObjects` over a ``kubernetes.aio`` ApiClient (the provider's, so one connection pool)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes.aio import client as k8s

        self.custom = k8s.CustomObjectsApi(api_client)

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await json_body(self.custom.get_namespaced_custom_object_without_preload_content(
                _GROUPS[plural], VERSION, namespace, plural, name))
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise

    async def create(self, plural: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await json_body(self.custom.create_namespaced_custom_object_without_preload_content(
            _GROUPS[plural], VERSION, namespace, plural, dict(body)))

    async def patch(self, plural: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            return await json_body(self.custom.patch_namespaced_custom_object_without_preload_content(
                _GROUPS[plural], VERSION, namespace, plural, name, dict(body), _content_type=MERGE_PATCH))
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise

    async def delete(self, plural: str, namespace: str, name: str, *, uid: str) -> bool:
        """Delete the object only if it is still ``uid`` (not a namesake made since), its dependents (the Sandbox,
        its Pod) by the garbage collector; False when it was already gone."""
        from kubernetes.aio.client import models as k8s_models

        options = k8s_models.V1DeleteOptions(propagation_policy="Background",
                                             preconditions=k8s_models.V1Preconditions(uid=uid))
        try:
            await json_body(self.custom.delete_namespaced_custom_object_without_preload_content(
                _GROUPS[plural], VERSION, namespace, plural, name, body=options), parse=False)
        except Exception as exc:
            if status_of(exc) in (404, 409):  # 409: the precondition, another object holds the name now
                return False
            raise
        return True

    async def list(self, plural: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        listing = await json_body(self.custom.list_namespaced_custom_object_without_preload_content(
            _GROUPS[plural], VERSION, namespace, plural, label_selector=selector))
        return list(listing.get("items") or [])
