"""The provider's requests and E2B's SDK's requests for the same operation, captured at the fake, agree on
method, path, query encoding (the raw query string as sent), the headers that matter and the body fields.
The differences that remain on purpose are named here (DELIBERATE) and in docs/providers.md ("E2B protocol as
the SDK speaks it"); everything else must be equal, so a change on either side fails the test."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import pytest
from e2b import AsyncSandbox, SandboxQuery, SandboxState

from durable_sandbox.providers.contract import SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import OWNER_METADATA_KEY, E2BProvider, snapshot_name
from tests.fakes.e2b_state import FakeState, RecordedRequest

SDK_VERSION = "2.63.0"  # the pin in pyproject's test extra; moving it means re-reading the SDK's source
OWNER = "team a: 100%25/sweep"
# Headers whose presence and value are part of the protocol (routing, auth, content negotiation, Connect).
HEADERS = ("Content-Type", "X-API-Key", "Idempotency-Key", "E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Access-Token",
           "Authorization", "Connect-Protocol-Version", "Connect-Timeout-Ms", "Keepalive-Ping-Interval")
# What the provider sends that the SDK does not, and why (see docs/providers.md).
DELIBERATE = {
    "command": {"tag"},  # the tool call's operation id names the process in envd
}


@pytest.fixture
def sdk(fake_e2b: FakeState) -> dict[str, Any]:
    return {"api_key": fake_e2b.api_key, "api_url": fake_e2b.api_url, "sandbox_url": fake_e2b.sandbox_url,
            "domain": "fake.test", "http_version": "1.1"}


def shape(fake: FakeState, request: RecordedRequest) -> dict[str, Any]:
    """The parts of a request that matter, with per-sandbox values replaced by what they stand for."""
    names = {fake.api_key: "<api key>"}
    for sandbox in fake.sandboxes.values():
        names[sandbox.id] = "<sandbox id>"
        names[sandbox.access_token] = "<access token of that sandbox>"

    def plain(text: str) -> str:
        for value, name in names.items():
            text = text.replace(value, name)
        return text

    headers = {h: plain(request.headers[h]) for h in HEADERS if h in request.headers}
    if "Idempotency-Key" in headers:
        assert re.fullmatch(r"[a-z0-9-]{1,255}", headers["Idempotency-Key"]), headers["Idempotency-Key"]
        headers["Idempotency-Key"] = "<valid key>"
    if headers.get("Content-Type", "").startswith("multipart/form-data"):
        headers["Content-Type"] = "multipart/form-data"  # the boundary is random
    if request.headers.get("X-Access-Token") and request.headers["X-Access-Token"] != fake.sandboxes[
            request.headers["E2b-Sandbox-Id"]].access_token:
        headers["X-Access-Token"] = "<a token of another sandbox>"
    return {"method": request.method, "path": plain(request.raw_path), "query": plain(request.raw_query),
            "headers": headers, "json": request.json, "envelope": request.envelope}


def since(fake: FakeState, mark: int) -> list[RecordedRequest]:
    return fake.requests[mark:]


def test_the_sdk_is_the_pinned_version() -> None:
    assert importlib.metadata.version("e2b") == SDK_VERSION


async def test_create(e2b: E2BProvider, sdk: dict[str, Any], fake_e2b: FakeState) -> None:
    mark = len(fake_e2b.requests)
    await e2b.provision(SandboxSpec(owner=OWNER, labels={"run": "r1"}, env={"K": "V"}, operation_id="op-1"),
                        lease_seconds=120)
    ours = since(fake_e2b, mark)
    mark = len(fake_e2b.requests)
    # The SDK is given what the provider always sends: a timeout and an idempotency key (see DELIBERATE docs).
    await AsyncSandbox.create(template="base", timeout=120, metadata={"run": "r1", OWNER_METADATA_KEY: OWNER},
                              envs={"K": "V"}, idempotency_key="sdk-key-1", **sdk)
    theirs = since(fake_e2b, mark)
    assert [shape(fake_e2b, r) for r in ours] == [shape(fake_e2b, r) for r in theirs]
    assert ours[0].path == "/v2/sandboxes" and ours[0].json["envVars"] == {"K": "V"}


async def test_list_across_states_and_pages(e2b: E2BProvider, sdk: dict[str, Any], fake_e2b: FakeState) -> None:
    for _ in range(3):
        await e2b.provision(SandboxSpec(owner=OWNER), lease_seconds=60)
    fake_e2b.sandboxes[sorted(fake_e2b.sandboxes)[0]].state = "paused"
    fake_e2b.page_size = 1
    mark = len(fake_e2b.requests)
    ours = [h.id for h in await e2b.list_sandboxes(OWNER)]
    our_requests = since(fake_e2b, mark)
    mark = len(fake_e2b.requests)
    paginator = AsyncSandbox.list(query=SandboxQuery(metadata={OWNER_METADATA_KEY: OWNER},
                                                     state=[SandboxState.RUNNING, SandboxState.PAUSED]), **sdk)
    theirs = []
    while paginator.has_next:
        theirs += [s.sandbox_id for s in await paginator.next_items()]
    assert ours == theirs and len(ours) == 3
    their_requests = since(fake_e2b, mark)
    assert len(our_requests) == 3, "one request per page, following X-Next-Token"
    assert [shape(fake_e2b, r) for r in our_requests] == [shape(fake_e2b, r) for r in their_requests]


async def test_snapshot_lookup_create_and_delete(e2b: E2BProvider, sdk: dict[str, Any], fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SandboxSpec(), lease_seconds=60)
    sandbox = await AsyncSandbox.create(template="base", **sdk)
    name = snapshot_name("snap-op")
    mark = len(fake_e2b.requests)
    snapshot_id = await e2b.snapshot(handle, operation_id="snap-op")
    await e2b.delete_snapshot(snapshot_id)
    ours = since(fake_e2b, mark)
    mark = len(fake_e2b.requests)
    assert await AsyncSandbox.list_snapshots(name=name, **sdk).next_items() == []
    info = await sandbox.create_snapshot(name=name)
    await AsyncSandbox.delete_snapshot(info.snapshot_id, **sdk)
    theirs = since(fake_e2b, mark)
    assert info.snapshot_id == snapshot_id
    assert [shape(fake_e2b, r) for r in ours] == [shape(fake_e2b, r) for r in theirs]
    assert [r.method for r in ours] == ["GET", "POST", "DELETE"]


async def test_command(e2b: E2BProvider, sdk: dict[str, Any], fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SandboxSpec(), lease_seconds=60)
    sandbox = await AsyncSandbox.connect(handle.id, **sdk)  # the same sandbox, so the routing values agree
    mark = len(fake_e2b.requests)
    await e2b.execute(handle, ToolCall(operation_id="op-7", type="shell",
                                       args={"command": "echo hi", "timeout": 5, "env": {"K": "V"}}))
    [ours] = since(fake_e2b, mark)
    mark = len(fake_e2b.requests)
    await sandbox.commands.run("echo hi", envs={"K": "V"}, timeout=5)
    [theirs] = since(fake_e2b, mark)
    our_shape, their_shape = shape(fake_e2b, ours), shape(fake_e2b, theirs)
    extra = our_shape["envelope"].keys() - their_shape["envelope"].keys()
    assert extra == DELIBERATE["command"] and our_shape["envelope"]["tag"] == "op-7"
    our_shape["envelope"] = {k: v for k, v in our_shape["envelope"].items() if k not in DELIBERATE["command"]}
    assert our_shape == their_shape
    assert their_shape["envelope"]["process"]["args"] == ["-l", "-c", "echo hi"]
    assert their_shape["headers"]["Connect-Timeout-Ms"] == "5000"


async def test_files(e2b: E2BProvider, sdk: dict[str, Any], fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SandboxSpec(), lease_seconds=60)
    sandbox = await AsyncSandbox.connect(handle.id, **sdk)
    mark = len(fake_e2b.requests)
    await e2b.execute(handle, ToolCall(operation_id="w", type="write_file", args={"path": "d/a.txt", "contents": "x"}))
    await e2b.execute(handle, ToolCall(operation_id="r", type="read_file", args={"path": "d/a.txt"}))
    ours = since(fake_e2b, mark)
    mark = len(fake_e2b.requests)
    await sandbox.files.write("d/a.txt", "x")
    assert await sandbox.files.read("d/a.txt") == "x"
    theirs = since(fake_e2b, mark)
    assert [shape(fake_e2b, r) for r in ours] == [shape(fake_e2b, r) for r in theirs]


async def test_the_sdk_defaults_the_provider_spells_out(sdk: dict[str, Any], fake_e2b: FakeState) -> None:
    """The comparisons above give the SDK what the provider always sends. Left to its defaults, the SDK sends
    no Idempotency-Key and no timeout on create, no state on list, and a 60 s Connect timeout on commands:
    the deliberate differences listed in docs/providers.md. If the SDK changes a default, this fails and
    the list must be re-read."""
    sandbox = await AsyncSandbox.create(**sdk)
    await AsyncSandbox.list(**sdk).next_items()
    await sandbox.commands.run("true")
    create, listing, start = (fake_e2b.calls("POST", "/v2/sandboxes")[0], fake_e2b.calls("GET", "/v2/sandboxes")[0],
                              fake_e2b.calls("POST", "/process.Process/Start")[0])
    assert "Idempotency-Key" not in create.headers and create.json == {"templateID": "base", "metadata": {},
                                                                       "envVars": {}}
    assert listing.raw_query == ""
    assert start.headers["Connect-Timeout-Ms"] == "60000" and "cwd" not in start.envelope["process"]
    assert start.envelope.keys() == {"process", "stdin"}
