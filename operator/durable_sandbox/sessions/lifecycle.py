"""A Sandbox's lifecycle through the call API (suspend, resume, delete, its state), done with the caller's own
credentials: the call API forwards the change to the API server under the caller's bearer token, never its own.

Why the caller's credentials and not a verb of the call API (``update sandboxes/calls``): suspending, resuming and
deleting change the Sandbox's spec or end it (and creating makes one), which is what the project's trust rule reserves to whoever may write
the Sandbox (nothing else may change what the operator runs or deletes). The API server itself then decides, by
the Sandbox's own verbs (``patch sandboxes`` to suspend or resume, ``delete sandboxes``, ``get sandboxes`` to read
its state, ``create sandboxes`` for the client's create-or-attach), with the caller named in its audit log, and the operator needs no right it does not already have: a
caller granted only ``create sandboxes/calls`` (the chart's ``durable-sandbox-sandbox-caller``) may call the
Sandbox but not suspend or delete it; ``durable-sandbox-sandbox-owner`` adds those. The request goes over a
connection that carries only the caller's token (no client certificate of the operator's: the API server would
otherwise take the certificate's identity first). The token is never logged or put in an answer.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

import httpx

from durable_sandbox.kube.api.resources import GROUP, SANDBOXES, VERSION
from durable_sandbox.sessions.errors import CallRefused

__all__ = ["KubeLifecycle", "Lifecycle", "SandboxState"]

SandboxState = dict[str, Any]  # {name, uid, phase, ready, suspended}
MERGE_PATCH = "application/merge-patch+json"


class Lifecycle(Protocol):
    """Changes to a Sandbox made with the caller's token (``None``: refused 401 before anything is sent)."""

    async def state(self, token: str | None, namespace: str, name: str) -> SandboxState: ...

    async def set_suspend(self, token: str | None, namespace: str, name: str, suspend: bool) -> SandboxState: ...

    async def delete(self, token: str | None, namespace: str, name: str) -> None: ...

    async def create_or_get(self, token: str | None, namespace: str, name: str,
                            spec: dict[str, Any]) -> SandboxState: ...


def state_of(body: dict[str, Any]) -> SandboxState:
    status = body.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return {"name": body["metadata"]["name"], "uid": body["metadata"].get("uid"), "phase": status.get("phase"),
            "ready": ready, "suspended": bool((body.get("spec") or {}).get("suspend"))}


class KubeLifecycle:
    def __init__(self, host: str, *, verify: bool | ssl.SSLContext = True, transport: Any = None) -> None:
        self._http = httpx.AsyncClient(base_url=host, verify=verify, timeout=30.0, transport=transport)

    @classmethod
    def of(cls, configuration: Any) -> KubeLifecycle:
        """The API server the operator talks to (its host and CA), without the operator's own credentials."""
        verify: bool | ssl.SSLContext = bool(getattr(configuration, "verify_ssl", True))
        if verify and getattr(configuration, "ssl_ca_cert", None):
            verify = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        return cls(str(configuration.host), verify=verify)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def state(self, token: str | None, namespace: str, name: str) -> SandboxState:
        return state_of(await self._send("GET", token, namespace, name, "read its state", "get"))

    async def set_suspend(self, token: str | None, namespace: str, name: str, suspend: bool) -> SandboxState:
        body = await self._send("PATCH", token, namespace, name, "suspend it" if suspend else "resume it", "patch",
                                json_body={"spec": {"suspend": suspend}})
        return state_of(body)

    async def delete(self, token: str | None, namespace: str, name: str) -> None:
        await self._send("DELETE", token, namespace, name, "delete it", "delete")

    async def create_or_get(self, token: str | None, namespace: str, name: str,
                            spec: dict[str, Any]) -> SandboxState:
        """Create Sandbox ``name`` with ``spec`` (needs create on sandboxes), or, when it exists, its state as it
        is (its spec is not changed: attaching never edits what another made)."""
        manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Sandbox",
                    "metadata": {"name": name, "namespace": namespace}, "spec": spec}
        try:
            return state_of(await self._send("POST", token, namespace, name, "create it", "create",
                                             json_body=manifest, collection=True))
        except CallRefused as refused:
            if refused.status != 409:
                raise
        return await self.state(token, namespace, name)

    async def _send(self, method: str, token: str | None, namespace: str, name: str, what: str, verb: str,
                    json_body: Any = None, collection: bool = False) -> dict[str, Any]:
        where = f"Sandbox {namespace}/{name}"
        if not token:
            raise CallRefused(401, "no bearer token in the request", where=f"{where}, Authorization header",
                              do="send 'Authorization: Bearer <token>' with a Kubernetes token")
        headers = {"Authorization": f"Bearer {token}"}
        if json_body is not None:
            headers["Content-Type"] = "application/json" if collection else MERGE_PATCH
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{SANDBOXES}" + ("" if collection else f"/{name}")
        try:
            answer = await self._http.request(method, path, headers=headers, json=json_body)
        except httpx.TransportError as exc:
            raise CallRefused(503, f"the API server did not answer ({type(exc).__name__})", where=where,
                              do="retry") from None
        if answer.status_code < 300:
            return dict(answer.json())
        if answer.status_code == 401:
            raise CallRefused(401, "the bearer token was not accepted by the API server", where=f"{where}, "
                              "Authorization header", do="send a current token (kubectl create token ...)")
        if answer.status_code == 403:
            raise CallRefused(403, f"the caller may not {what} ({verb} sandboxes)", where=where,
                              do=f"bind the ClusterRole durable-sandbox-sandbox-owner (or a Role granting {verb} on "
                              f"sandboxes) to the caller in namespace {namespace}")
        if answer.status_code == 404:
            raise CallRefused(404, "no such Sandbox", where=where, do="create it (kubectl apply) or name another one")
        if answer.status_code == 409:
            raise CallRefused(409, "the Sandbox exists already" if collection else "the Sandbox changed meanwhile",
                              where=where, do="retry", retry=not collection)
        if answer.status_code == 422:
            raise CallRefused(400, f"the API server refused the Sandbox: {_message(answer)}", where=f"{where}, spec",
                              do="fix the spec (docs/kubernetes.md#sandbox-resources lists its fields)")
        raise CallRefused(503 if answer.status_code >= 500 else 400,
                          f"the API server answered {answer.status_code} to {what}", where=where, do="retry later")


def _message(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("message", ""))[:500]
    except ValueError:
        return answer.text[:500]
