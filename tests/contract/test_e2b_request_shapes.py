"""The fake E2B server checks every request against the documented shape (and answers 400 with the reason),
so these tests prove both sides: the adapter's requests are exactly as documented, and drift is caught."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator

import httpx
import pytest

from durable_sandbox.providers.contract import SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import OWNER_METADATA_KEY, E2BProvider
from tests.contract.e2b_support import make_provider
from tests.fakes.e2b_state import FakeState


@pytest.fixture
async def e2b(fake_e2b: FakeState) -> AsyncIterator[E2BProvider]:
    provider = make_provider(fake_e2b)
    yield provider
    await provider.aclose()


async def test_adapter_requests_match_the_documented_shapes(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    spec = SandboxSpec(owner="cluster-1", labels={"run": "r1"}, env={"TOKEN": "t"})
    handle = await e2b.provision(spec, lease_seconds=120)
    await e2b.execute(handle, ToolCall(operation_id="op-w", type="write_file", args={"path": "a/b.txt", "contents": "x"}))
    await e2b.execute(handle, ToolCall(operation_id="op-r", type="read_file", args={"path": "a/b.txt"}))
    await e2b.execute(handle, ToolCall(operation_id="op-s", type="shell", args={"command": "ls", "cwd": "a", "env": {"K": "V"}}))
    await e2b.list_sandboxes("cluster-1")
    await e2b.destroy(handle)
    assert fake_e2b.rejections() == []

    create, listing, delete = fake_e2b.calls("POST", "/sandboxes")[0], fake_e2b.calls("GET", "/sandboxes")[0], \
        fake_e2b.calls("DELETE", "/sandboxes")[0]
    assert create.server == "api" and create.headers["X-API-Key"] == fake_e2b.api_key
    assert create.json == {"templateID": "base", "timeout": 120, "secure": True,
                           "metadata": {"run": "r1", OWNER_METADATA_KEY: "cluster-1"}, "envVars": {"TOKEN": "t"}}
    assert listing.query == {"metadata": "durable-sandbox.dev%2Fowner=cluster-1"}
    assert delete.path == f"/sandboxes/{handle.id}"

    write, read = fake_e2b.calls("POST", "/files")[0], fake_e2b.calls("GET", "/files")[0]
    for envd in (write, read):
        assert envd.server == "envd"
        assert envd.headers["E2b-Sandbox-Id"] == handle.id and envd.headers["E2b-Sandbox-Port"] == "49983"
        assert "X-API-Key" not in envd.headers, "the API key never goes to the sandbox host"
        assert envd.query == {"path": "a/b.txt", "username": "user"}
    assert write.headers["Content-Type"].startswith("multipart/form-data")

    start = fake_e2b.calls("POST", "/process.Process/Start")[0]
    assert start.headers["Content-Type"] == "application/connect+json"
    assert start.headers["Connect-Protocol-Version"] == "1"
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
    assert json.loads(body[5:]) == {"process": {"cmd": "/bin/bash", "args": ["-lc", "echo hi"], "cwd": "/home/user"},
                                    "tag": "op-42", "stdin": False}


# --------------------------------------------------------------------------------------------- drift is caught


def _envelope(payload: object) -> bytes:
    raw = json.dumps(payload).encode()
    return struct.pack(">BI", 0, len(raw)) + raw


MALFORMED_API: list[tuple[str, str, dict[str, object], str]] = [
    ("POST", "/sandboxes", {"json": {"templateID": "base", "timeout": 60, "metadata": {}}}, "missing field(s) ['secure']"),
    ("POST", "/sandboxes", {"json": {"templateID": "base", "timeout": 60, "secure": False, "metadata": {}}},
     "secure must be true"),
    ("POST", "/sandboxes", {"json": {"templateID": "base", "timeout": 60, "secure": True, "metadata": {}, "ttl": 1}},
     "unknown field(s) ['ttl']"),
    ("POST", "/sandboxes", {"json": {"templateID": "base", "timeout": 90000, "secure": True, "metadata": {}}},
     "timeout must be an integer number of seconds in [0, 86400]"),
    ("POST", "/sandboxes", {"content": b"templateID=base"}, "needs Content-Type application/json"),
    ("POST", "/sandboxes/x/timeout", {"json": {"seconds": 5}}, "missing field(s) ['timeout']"),
    ("POST", "/sandboxes/x/snapshots", {"json": {"name": "a/b"}}, "without '/' or ':'"),
    ("GET", "/snapshots", {"params": {"limit": "500"}}, "limit must be an integer in [1, 100]"),
    ("GET", "/sandboxes", {"params": {"owner": "x"}}, "unknown query parameter(s) ['owner']"),
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
        assert (await client.get("/sandboxes")).json() == {"code": 401, "message": "missing X-API-Key header"}
        assert (await client.get("/sandboxes", headers={"X-API-Key": "nope"})).status_code == 401


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
             "one part named 'file'"),
            (await client.post("/files", params={"path": "a"}, content=b"x", headers=auth), 400, "multipart/form-data"),
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
            (await client.get("/health", headers=auth), 400, "no such route"),
        ]
    for response, status, reason in cases:
        assert (response.status_code, reason in response.text) == (status, True), response.text
