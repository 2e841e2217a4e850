"""A Sandbox's lifecycle through the call API (sessions/lifecycle.py): suspend, resume, delete and its state are
forwarded to the API server with the caller's own token (never the operator's), so RBAC on the Sandbox itself
decides; refusals come back as what/where/do; the client's methods (state, suspend, resume, delete, wait_ready)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_sandbox.client import AsyncSandboxClient, SandboxCallError, SandboxClient
from durable_sandbox.sessions.http import create_app
from durable_sandbox.sessions.lifecycle import KubeLifecycle
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import local_gate, service

PATH = "/apis/durable-sandbox.dev/v1alpha1/namespaces/demo/sandboxes/box"


class FakeApiServer:
    """Sandbox demo/box; token ``tok-owner`` may get, patch and delete it, ``tok-caller`` may only get it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, Any]] = []  # (method, path, Authorization, body)
        self.body: dict[str, Any] | None = {"metadata": {"name": "box", "uid": "u1"}, "spec": {"suspend": False},
                                            "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}

    def handle(self, request: httpx.Request) -> httpx.Response:
        auth = request.headers.get("authorization", "")
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, auth, body))
        if auth not in ("Bearer tok-owner", "Bearer tok-caller"):
            return httpx.Response(401, json={"kind": "Status"})
        if request.method == "POST" and request.url.path == PATH.rsplit("/", 1)[0]:
            if auth != "Bearer tok-owner":
                return httpx.Response(403, json={"kind": "Status"})
            if self.body is not None:
                return httpx.Response(409, json={"kind": "Status", "reason": "AlreadyExists"})
            self.body = {**body, "metadata": {**body["metadata"], "uid": "u2"},
                         "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
            return httpx.Response(201, json=self.body)
        if request.url.path != PATH or self.body is None:
            return httpx.Response(404, json={"kind": "Status"})
        if request.method != "GET" and auth != "Bearer tok-owner":
            return httpx.Response(403, json={"kind": "Status"})
        if request.method == "PATCH":
            assert request.headers["content-type"] == "application/merge-patch+json"
            self.body["spec"].update(body["spec"])
            suspended = self.body["spec"]["suspend"]
            self.body["status"] = {"phase": "Suspended" if suspended else "Resuming", "conditions": []}
        if request.method == "DELETE":
            self.body = None
            return httpx.Response(200, json={"kind": "Status", "status": "Success"})
        return httpx.Response(200, json=self.body)


async def app_and_server(tmp_path: Path) -> tuple[Any, FakeApiServer]:
    server = FakeApiServer()
    lifecycle = KubeLifecycle("https://apiserver.test", transport=httpx.MockTransport(server.handle))
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"))
    return create_app(svc, lifecycle), server


async def test_lifecycle_requests_go_to_the_api_server_with_the_callers_token(tmp_path: Path) -> None:
    app, server = await app_and_server(tmp_path)
    base = "http://sessions/v1/namespaces/demo/sandboxes/box"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        state = await http.get(base, headers={"Authorization": "Bearer tok-caller"})
        assert state.json() == {"name": "box", "uid": "u1", "phase": "Ready", "ready": True, "suspended": False}
        refused = await http.post(f"{base}/suspend", headers={"Authorization": "Bearer tok-caller"})
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert "may not suspend it (patch sandboxes)" in error["what"] and "durable-sandbox-sandbox-owner" in error["do"]
        assert "tok-caller" not in json.dumps(error)  # the token is never in an answer
        suspended = await http.post(f"{base}/suspend", headers={"Authorization": "Bearer tok-owner"})
        assert suspended.json()["suspended"] is True and suspended.json()["phase"] == "Suspended"
        resumed = await http.post(f"{base}/resume", headers={"Authorization": "Bearer tok-owner"})
        assert resumed.json()["suspended"] is False
        assert (await http.delete(base, headers={"Authorization": "Bearer tok-caller"})).status_code == 403
        assert (await http.delete(base, headers={"Authorization": "Bearer tok-owner"})).json() == {"deleted": True}
        assert (await http.get(base, headers={"Authorization": "Bearer tok-owner"})).status_code == 404
        assert (await http.get(base)).status_code == 401
    assert [(m, auth) for m, _, auth, _ in server.seen] == [
        ("GET", "Bearer tok-caller"), ("PATCH", "Bearer tok-caller"), ("PATCH", "Bearer tok-owner"), ("PATCH", "Bearer tok-owner"),
        ("DELETE", "Bearer tok-caller"), ("DELETE", "Bearer tok-owner"), ("GET", "Bearer tok-owner")]  # no token: nothing sent
    assert [body for m, _, _, body in server.seen if m == "PATCH"][-2:] == [{"spec": {"suspend": True}},
                                                                           {"spec": {"suspend": False}}]


async def test_the_client_suspends_resumes_waits_and_deletes(tmp_path: Path) -> None:
    app, server = await app_and_server(tmp_path)
    # httpx's ASGITransport is async only: the async client here (the sync one's methods are the same).
    async with AsyncSandboxClient.attach("box", namespace="demo", url="http://sessions", token="tok-owner",
                                         transport=httpx.ASGITransport(app=app)) as box:
        assert (await box.state())["ready"] is True
        assert (await box.suspend())["suspended"] is True
        await box.resume()
        assert server.body is not None
        server.body["status"] = {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}
        assert (await box.wait_ready(timeout=5, poll=0.01))["phase"] == "Ready"
        await box.delete()
        with pytest.raises(SandboxCallError) as missing:
            await box.state()
        assert missing.value.status == 404


def test_wait_ready_says_what_the_sandbox_waits_for() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"name": "box", "phase": "Resuming", "ready": False, "suspended": False})

    with SandboxClient.attach("box", namespace="demo", url="http://sessions.test", token="t",
                              transport=httpx.MockTransport(handle)) as box:
        with pytest.raises(TimeoutError, match="phase Resuming"):
            box.wait_ready(timeout=0.05, poll=0.01)


async def test_create_or_attach_creates_once_then_attaches_as_it_is(tmp_path: Path) -> None:
    app, server = await app_and_server(tmp_path)
    server.body = None
    transport = httpx.ASGITransport(app=app)
    made = await AsyncSandboxClient.create_or_attach("box", spec={"provider": "local"}, namespace="demo",
                                                     url="http://sessions", token="tok-owner", transport=transport)
    async with made:
        assert (await made.state())["uid"] == "u2"
    assert server.body is not None and server.body["spec"] == {"provider": "local"}
    again = await AsyncSandboxClient.create_or_attach("box", spec={"provider": "kubernetes"}, namespace="demo",
                                                      url="http://sessions", token="tok-owner", transport=transport)
    async with again:
        assert (await again.state())["uid"] == "u2"
    assert server.body["spec"] == {"provider": "local"}  # attaching never edits what exists
    with pytest.raises(SandboxCallError) as refused:
        await AsyncSandboxClient.create_or_attach("box", namespace="demo", url="http://sessions", token="tok-caller",
                                                  transport=transport)
    assert refused.value.status == 403 and "create sandboxes" in str(refused.value)
