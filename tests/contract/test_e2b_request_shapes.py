"""The fake E2B server checks every request against the protocol as E2B's SDK speaks it (and answers 400 with
the reason), so these tests prove both sides: the adapter's requests have that shape, and drift is caught.
The comparison with the SDK's own requests is in test_e2b_sdk_request_shapes.py."""

from __future__ import annotations

import base64
import json
import re
import struct

import httpx
import pytest

from durable_sandbox.providers.contract import SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import OWNER_METADATA_KEY, E2BProvider
from tests.contract.e2b_support import make_provider
from tests.fakes import e2b_server
from tests.fakes.e2b_state import FakeState


async def test_adapter_requests_match_the_documented_shapes(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    spec = SandboxSpec(owner="cluster-1", labels={"run": "r1"}, env={"TOKEN": "t"})
    handle = await e2b.provision(spec, lease_seconds=120)
    await e2b.execute(handle, ToolCall(operation_id="op-w", type="write_file", args={"path": "a/b.txt", "contents": "x"}))
    await e2b.execute(handle, ToolCall(operation_id="op-r", type="read_file", args={"path": "a/b.txt"}))
    await e2b.execute(handle, ToolCall(operation_id="op-s", type="shell", args={"command": "ls", "cwd": "a", "env": {"K": "V"}}))
    await e2b.list_sandboxes("cluster-1")
    await e2b.destroy(handle)
    assert fake_e2b.rejections() == []

    create, listing, delete = fake_e2b.calls("POST", "/v2/sandboxes")[0], fake_e2b.calls("GET", "/v2/sandboxes")[0], \
        fake_e2b.calls("DELETE", "/sandboxes")[0]
    assert create.server == "api" and create.headers["X-API-Key"] == fake_e2b.api_key
    assert create.json == {"templateID": "base", "timeout": 120,
                           "metadata": {"run": "r1", OWNER_METADATA_KEY: "cluster-1"}, "envVars": {"TOKEN": "t"}}
    assert re.fullmatch(r"dsb-[0-9a-f]{48}", create.headers["Idempotency-Key"])
    # Keys and values are quoted before the pairs are form-encoded, as the SDK does ('/' stays, '%' doubles).
    assert listing.query == {"metadata": "durable-sandbox.dev%2Fowner=cluster-1", "state": "running,paused"}
    assert delete.path == f"/sandboxes/{handle.id}"

    write, read = fake_e2b.calls("POST", "/files")[0], fake_e2b.calls("GET", "/files")[0]
    for envd in (write, read):
        assert envd.server == "envd"
        assert envd.headers["E2b-Sandbox-Id"] == handle.id and envd.headers["E2b-Sandbox-Port"] == "49983"
        assert "X-API-Key" not in envd.headers, "the API key never goes to the sandbox host"
        assert envd.query == {"path": "a/b.txt"}, "envd >= 0.4.0 has a default user: none is named"
    assert write.headers["Content-Type"].startswith("multipart/form-data")

    start = fake_e2b.calls("POST", "/process.Process/Start")[0]
    assert start.headers["Content-Type"] == "application/connect+json"
    assert start.headers["Connect-Protocol-Version"] == "1"
    assert "Authorization" not in start.headers and "Connect-Timeout-Ms" not in start.headers


async def test_an_old_envd_gets_the_user_named(fake_e2b: FakeState, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before envd 0.4.0 there is no default user: /files takes username=, RPCs Authorization: Basic."""
    monkeypatch.setattr(e2b_server, "ENVD_VERSION", "0.3.9")
    provider = make_provider(fake_e2b)
    handle = await provider.provision(SandboxSpec(), lease_seconds=60)
    await provider.execute(handle, ToolCall(operation_id="w", type="write_file", args={"path": "a", "contents": "x"}))
    await provider.execute(handle, ToolCall(operation_id="s", type="shell", args={"command": "true"}))
    await provider.aclose()
    assert fake_e2b.calls("POST", "/files")[0].query == {"path": "a", "username": "user"}
    start = fake_e2b.calls("POST", "/process.Process/Start")[0]
    assert start.headers["Authorization"] == "Basic " + base64.b64encode(b"user:").decode()


async def test_process_start_body_is_one_connect_envelope(fake_e2b: FakeState) -> None:
    """Capture the exact bytes on the wire (the fake records parsed JSON only for JSON bodies)."""
    captured: list[bytes] = []

    async def record(request: httpx.Request) -> None:
        if request.url.path.endswith("/process.Process/Start"):
            captured.append(request.content)

    provider = make_provider(fake_e2b)
    provider._client.event_hooks["request"].append(record)
    handle = await provider.provision(SandboxSpec(), lease_seconds=60)
    await provider.execute(handle, ToolCall(operation_id="op-42", type="shell", args={"command": "echo hi"}))
    await provider.aclose()
    [body] = captured
    flags, length = struct.unpack(">BI", body[:5])
    assert flags == 0 and length == len(body) - 5
    assert json.loads(body[5:]) == {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"]},
                                    "tag": "op-42", "stdin": False}


# --------------------------------------------------------------------------------------------- drift is caught


def _envelope(payload: object) -> bytes:
    raw = json.dumps(payload).encode()
    return struct.pack(">BI", 0, len(raw)) + raw


MALFORMED_API: list[tuple[str, str, dict[str, object], str]] = [
    ("POST", "/v2/sandboxes", {"json": {"timeout": 60, "metadata": {}}}, "missing field(s) ['templateID']"),
    ("POST", "/v2/sandboxes", {"json": {"templateID": "base", "secure": True}}, "unknown field(s) ['secure']"),
    ("POST", "/v2/sandboxes", {"json": {"templateID": "base", "timeout": 60, "metadata": {}, "ttl": 1}},
     "unknown field(s) ['ttl']"),
    ("POST", "/v2/sandboxes", {"json": {"templateID": "base", "timeout": 90000}},
     "timeout must be an integer number of seconds in [0, 86400]"),
    ("POST", "/v2/sandboxes", {"json": {"templateID": "base"}, "headers": {"Idempotency-Key": "Op_1"}},
     "Idempotency-Key must be 1-255 lowercase letters, digits or hyphens"),
    ("POST", "/v2/sandboxes", {"content": b"templateID=base"}, "needs Content-Type application/json"),
    ("POST", "/sandboxes", {"json": {"templateID": "base", "secure": True}},
     "no such route in E2B's protocol: POST /sandboxes"),
    ("GET", "/sandboxes", {}, "no such route in E2B's protocol: GET /sandboxes"),
    ("GET", "/v2/sandboxes", {"params": {"state": "stopped"}}, "state must be a comma-separated list"),
    ("GET", "/v2/sandboxes", {"params": {"nextToken": "bogus"}}, "was not handed out by this server"),
    ("POST", "/sandboxes/x/pause", {"json": {"keepMemory": True}}, "unknown field(s) ['keepMemory']"),
    ("POST", "/sandboxes/x/timeout", {"json": {"seconds": 5}}, "missing field(s) ['timeout']"),
    ("POST", "/sandboxes/x/snapshots", {"json": {"name": "a/b"}}, "without '/' or ':'"),
    ("GET", "/snapshots", {"params": {"limit": "500"}}, "limit must be an integer in [1, 100]"),
    ("GET", "/v2/sandboxes", {"params": {"owner": "x"}}, "unknown query parameter(s) ['owner']"),
    ("DELETE", "/templates/team/name:default", {}, "template id must be URL-encoded"),
    ("POST", "/sandbox", {"json": {}}, "no such route in E2B's protocol: POST /sandbox"),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "reason"), MALFORMED_API, ids=[m[3][:30] for m in MALFORMED_API])
async def test_fake_rejects_malformed_api_requests(fake_e2b: FakeState, method: str, path: str,
                                                   kwargs: dict[str, object], reason: str) -> None:
    fake_e2b.rejections_expected = True
    async with httpx.AsyncClient(base_url=fake_e2b.api_url, headers={"X-API-Key": fake_e2b.api_key}) as client:
        response = await client.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 400
    assert reason in response.json()["message"]
    assert response.json()["code"] == 400
    assert fake_e2b.rejections()[-1].rejection == response.json()["message"]


async def test_fake_requires_the_api_key(fake_e2b: FakeState) -> None:
    async with httpx.AsyncClient(base_url=fake_e2b.api_url) as client:
        assert (await client.get("/v2/sandboxes")).json() == {"code": 401, "message": "missing X-API-Key header"}
        assert (await client.get("/v2/sandboxes", headers={"X-API-Key": "nope"})).status_code == 401


async def test_fake_rejects_malformed_envd_requests(fake_e2b: FakeState) -> None:
    fake_e2b.rejections_expected = True
    sandbox = fake_e2b.create_sandbox("base", 60, {}, {})
    routing = {"E2b-Sandbox-Id": sandbox.id, "E2b-Sandbox-Port": "49983"}
    auth = {**routing, "X-Access-Token": sandbox.access_token}
    connect = {**auth, "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    good = {"process": {"cmd": "/bin/bash", "args": ["-lc", "true"]}}
    async with httpx.AsyncClient(base_url=fake_e2b.sandbox_url) as client:
        cases: list[tuple[httpx.Response, int, str]] = [
            (await client.get("/files", params={"path": "a"}, headers={"E2b-Sandbox-Id": sandbox.id}), 400,
             "E2b-Sandbox-Port: 49983"),
            (await client.get("/files", params={"path": "a"}, headers=routing), 401, "missing or invalid X-Access-Token"),
            (await client.get("/files", headers=auth), 400, "missing query parameter(s) ['path']"),
            (await client.post("/files", params={"path": "a"}, files={"upload": ("a", b"x")}, headers=auth), 400,
             "parts named 'file'"),
            (await client.post("/files", params={"path": "a"}, content=b"x", headers={**auth, "Content-Type": "text/plain"}),
             400, "application/octet-stream or multipart/form-data"),
            (await client.post("/files", content=b"x", headers={**auth, "Content-Type": "application/octet-stream"}),
             400, "needs ?path="),
            (await client.get("/files", params={"path": "a", "username": "root"}, headers=auth), 400,
             "only runs as user 'user'"),
            (await client.post("/filesystem.Filesystem/ListDir", json={"path": "a", "recursive": True},
                               headers={**auth, "Connect-Protocol-Version": "1"}), 400, "unknown field(s) ['recursive']"),
            (await client.post("/filesystem.Filesystem/Stat", content=_envelope({"path": "a"}),
                               headers={**auth, "Content-Type": "application/connect+json"}), 400,
             "Connect unary, JSON codec"),
            (await client.get("/files", params={"path": "/etc/passwd"}, headers=auth), 400, "only serves paths under"),
            (await client.post("/process.Process/Start", content=_envelope(good),
                               headers={**auth, "Content-Type": "application/json"}), 400, "application/connect+json"),
            (await client.post("/process.Process/Start", content=json.dumps(good).encode(), headers=connect), 400,
             "request envelope flags must be 0x00"),
            (await client.post("/process.Process/Start", content=_envelope({"process": {"command": "ls"}}),
                               headers=connect), 400, "missing field(s) ['cmd']"),
            (await client.post("/process.Process/Start", content=_envelope({**good, "stdin": True}), headers=connect),
             400, "stdin: false"),
            (await client.post("/process.Process/Start", content=_envelope(good),
                               headers={**connect, "Connect-Timeout-Ms": "soon"}), 400, "Connect-Timeout-Ms"),
            (await client.get("/envd/health", headers=auth), 400, "no such route"),
        ]
    for response, status, reason in cases:
        assert (response.status_code, reason in response.text) == (status, True), response.text
