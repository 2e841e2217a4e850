"""E2B's official Python SDK (``e2b``, pinned in the test extra) drives the fake E2B server: every call must
succeed, and the ``fake_e2b`` fixture still fails the test if the fake rejected any request as an unknown
shape. The SDK was written by E2B against the real service, so this is the closest ground truth a test here
can reach: if the fake answers the SDK, the fake speaks E2B's protocol, and the provider is held to the same
fake (and compared with the SDK request by request in test_e2b_sdk_request_shapes.py).

Issue 14's items: (1) create on v2 with metadata and an Idempotency-Key, (2) list by metadata and by state
with paging, (3) snapshots with full names, (4) detail fields, envd version, octet-stream writes, ListDir,
Stat, health, pause, connect, snapshot ``mode="full"``, (5) the sandbox URL rule and routing headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from e2b import AsyncSandbox, CommandExitException, FileType, SandboxException, SandboxQuery, SandboxState
from e2b.connection_config import ConnectionConfig

from durable_sandbox.providers import e2b_api
from tests.fakes.e2b_state import ENVD_VERSION, TEAM_SLUG, FakeState

OWNER = {"durable-sandbox.dev/owner": "team a: 100%25/sweep"}  # characters the double encoding must carry


@pytest.fixture
def sdk(fake_e2b: FakeState) -> dict[str, Any]:
    """Connection options pointing the SDK at the fake (HTTP/1.1: the fake is a plain aiohttp server)."""
    return {"api_key": fake_e2b.api_key, "api_url": fake_e2b.api_url, "sandbox_url": fake_e2b.sandbox_url,
            "domain": "fake.test", "http_version": "1.1", "request_timeout": 30}


@pytest.fixture
async def sandbox(sdk: dict[str, Any]) -> AsyncIterator[AsyncSandbox]:
    sbx = await AsyncSandbox.create(metadata=OWNER, timeout=300, idempotency_key="conformance-1", **sdk)
    yield sbx
    await AsyncSandbox.kill(sbx.sandbox_id, **sdk)


async def test_create_is_v2_with_metadata_and_an_idempotency_key(sdk: dict[str, Any], sandbox: AsyncSandbox,
                                                                 fake_e2b: FakeState) -> None:
    again = await AsyncSandbox.create(metadata=OWNER, timeout=300, idempotency_key="conformance-1", **sdk)
    assert again.sandbox_id == sandbox.sandbox_id, "a retry with the same key is the same sandbox"
    creates = fake_e2b.calls("POST", "/v2/sandboxes")
    assert [r.headers["Idempotency-Key"] for r in creates] == ["conformance-1"] * 2
    assert creates[0].json == {"templateID": "base", "timeout": 300, "metadata": OWNER, "envVars": {}}
    assert fake_e2b.sandboxes[sandbox.sandbox_id].metadata == OWNER
    info = await sandbox.get_info()
    assert (info.metadata, info.state, info.envd_version) == (OWNER, SandboxState.RUNNING, ENVD_VERSION)
    assert (info.cpu_count, info.memory_mb) == (2, 512)


async def test_commands_files_and_timeout(sandbox: AsyncSandbox, fake_e2b: FakeState) -> None:
    with pytest.raises(CommandExitException) as failed:
        await sandbox.commands.run("echo out; echo err >&2; exit 3", envs={"K": "V"}, timeout=20)
    assert (failed.value.exit_code, failed.value.stdout, failed.value.stderr) == (3, "out\n", "err\n")
    ok = await sandbox.commands.run('echo "$K" && pwd', envs={"K": "V"}, cwd="/home/user")
    assert (ok.exit_code, ok.stdout) == (0, "V\n" + str(fake_e2b.sandboxes[sandbox.sandbox_id].workspace) + "\n")

    await sandbox.files.write("dir/text.txt", "hello")                                  # multipart
    await sandbox.files.write("dir/raw.bin", b"\x00\x01", use_octet_stream=True)       # octet-stream (envd >= 0.5.7)
    await sandbox.files.write_files([{"path": "dir/a.txt", "data": "a"}, {"path": "dir/b.txt", "data": "b"}])
    assert await sandbox.files.read("dir/text.txt") == "hello"
    assert await sandbox.files.read("dir/raw.bin", format="bytes") == b"\x00\x01"
    listed = await sandbox.files.list("dir")
    assert sorted(e.name for e in listed) == ["a.txt", "b.txt", "raw.bin", "text.txt"]
    info = await sandbox.files.get_info("dir/text.txt")
    assert (info.type, info.size, info.path) == (FileType.FILE, 5, "/home/user/dir/text.txt")
    assert await sandbox.files.exists("dir/missing.txt") is False
    assert await sandbox.is_running() is True                                            # GET /health
    octet = [r for r in fake_e2b.calls("POST", "/files") if r.headers["Content-Type"] == "application/octet-stream"]
    assert [r.query["path"] for r in octet] == ["dir/raw.bin"]

    await sandbox.set_timeout(600)
    assert fake_e2b.calls("POST", f"/sandboxes/{sandbox.sandbox_id}/timeout")[0].json == {"timeout": 600}
    fake_e2b.advance(300)  # past the create's 300 s, within the new 600 s
    assert sandbox.sandbox_id in fake_e2b.live_sandboxes()


async def test_list_by_metadata_and_state_with_paging(sdk: dict[str, Any], sandbox: AsyncSandbox,
                                                      fake_e2b: FakeState) -> None:
    second = await AsyncSandbox.create(metadata=OWNER, **sdk)
    other = await AsyncSandbox.create(metadata={"durable-sandbox.dev/owner": "someone else"}, **sdk)
    await second.pause()
    fake_e2b.page_size = 1

    async def every_page(query: SandboxQuery) -> list[str]:
        paginator = AsyncSandbox.list(query=query, limit=1, **sdk)
        ids = []
        while paginator.has_next:
            ids += [s.sandbox_id for s in await paginator.next_items()]
        return ids

    assert await every_page(SandboxQuery(metadata=OWNER)) == [sandbox.sandbox_id, second.sandbox_id]
    assert await every_page(SandboxQuery(state=[SandboxState.PAUSED])) == [second.sandbox_id]
    assert await every_page(SandboxQuery(metadata=OWNER, state=[SandboxState.RUNNING])) == [sandbox.sandbox_id]
    listed = fake_e2b.calls("GET", "/v2/sandboxes")
    assert any("nextToken" in r.query for r in listed), "the SDK followed X-Next-Token"
    assert listed[0].query["metadata"] == e2b_api.metadata_query(OWNER), "the provider encodes like the SDK"
    await AsyncSandbox.kill(second.sandbox_id, **sdk)
    await other.kill()


async def test_snapshots_create_list_delete(sdk: dict[str, Any], sandbox: AsyncSandbox, fake_e2b: FakeState) -> None:
    await sandbox.files.write("kept.txt", "state")
    named = await sandbox.create_snapshot(name="conformance-snap")
    full = await sandbox.create_snapshot(mode="full")                                   # sends memory: true
    assert named.names == [f"{TEAM_SLUG}/conformance-snap:default"] and named.snapshot_id == named.names[0]
    assert full.names == [] and fake_e2b.calls("POST", f"/sandboxes/{sandbox.sandbox_id}/snapshots")[1].json == {
        "memory": True}
    assert e2b_api.bare_snapshot_name(named.names[0]) == "conformance-snap"

    fake_e2b.page_size = 1
    paginator = AsyncSandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, **sdk)
    found = []
    while paginator.has_next:
        found += [s.snapshot_id for s in await paginator.next_items()]
    assert found == [named.snapshot_id, full.snapshot_id]
    by_name = AsyncSandbox.list_snapshots(name=f"{TEAM_SLUG}/conformance-snap", **sdk)
    assert [s.snapshot_id for s in await by_name.next_items()] == [named.snapshot_id]

    restored = await AsyncSandbox.create(template=named.snapshot_id, **sdk)
    assert await restored.files.read("kept.txt") == "state"
    await restored.kill()
    assert await AsyncSandbox.delete_snapshot(named.snapshot_id, **sdk) is True
    assert await AsyncSandbox.delete_snapshot(named.snapshot_id, **sdk) is False        # 404: already gone
    assert await AsyncSandbox.delete_snapshot(full.snapshot_id, **sdk) is True
    assert fake_e2b.snapshots() == []


async def test_pause_connect_kill(sdk: dict[str, Any], sandbox: AsyncSandbox, fake_e2b: FakeState) -> None:
    await sandbox.files.write("note.txt", "before pause")
    assert await sandbox.pause() is True
    assert (await sandbox.get_info()).state == SandboxState.PAUSED
    assert await sandbox.is_running() is False, "envd of a paused sandbox is unreachable (502)"
    fake_e2b.advance(10_000)
    assert sandbox.sandbox_id in fake_e2b.live_sandboxes(), "a paused sandbox outlives its timeout"

    resumed = await AsyncSandbox.connect(sandbox.sandbox_id, timeout=120, **sdk)
    assert (await resumed.get_info()).state == SandboxState.RUNNING
    assert await resumed.files.read("note.txt") == "before pause"
    again = await AsyncSandbox.connect(sandbox.sandbox_id, **sdk)                       # already running: 200
    assert again.sandbox_id == sandbox.sandbox_id
    assert [r.status for r in fake_e2b.calls("POST", "/v2/sandboxes/")] == [201, 200]

    assert await resumed.kill() is True
    assert await AsyncSandbox.kill(sandbox.sandbox_id, **sdk) is False
    assert sandbox.sandbox_id not in fake_e2b.live_sandboxes()


async def test_the_fake_still_rejects_what_it_does_not_emulate(sdk: dict[str, Any], fake_e2b: FakeState) -> None:
    """Auto-pause on timeout is a real E2B feature, but the fake cannot honour it (a paused sandbox would
    outlive its timeout unnoticed), so it refuses it loudly instead of pretending."""
    fake_e2b.rejections_expected = True
    with pytest.raises(SandboxException, match="does not emulate autoPause"):
        await AsyncSandbox.create(lifecycle={"on_timeout": "pause"}, **sdk)
    assert fake_e2b.rejections()[-1].json["autoPause"] is True and fake_e2b.live_sandboxes() == []


@pytest.mark.parametrize("domain", ["e2b.app", "e2b.dev", "e2b-staging.dev", "sandboxes.example.com", "localhost.test"])
def test_the_sandbox_url_rule_is_the_sdks(domain: str) -> None:
    """E2B's own domains use the shared host sandbox.<domain> (routed by headers), others a host per sandbox."""
    config = ConnectionConfig(api_key="k", domain=domain)
    assert e2b_api.sandbox_url("isbx1", domain, None) == config.get_sandbox_url("isbx1", domain)
    override = ConnectionConfig(api_key="k", domain=domain, sandbox_url="http://127.0.0.1:9")
    assert e2b_api.sandbox_url("isbx1", domain, "http://127.0.0.1:9") == override.get_sandbox_url("isbx1", domain)


async def test_every_envd_request_carried_the_routing_headers(sandbox: AsyncSandbox, fake_e2b: FakeState) -> None:
    await sandbox.commands.run("true")
    await sandbox.files.write("x", "y")
    envd = [r for r in fake_e2b.requests if r.server == "envd"]
    assert len(envd) == 2 and all(r.headers["E2b-Sandbox-Id"] == sandbox.sandbox_id for r in envd)
    assert all(r.headers["E2b-Sandbox-Port"] == str(e2b_api.ENVD_PORT) for r in envd)
    assert all("Authorization" not in r.headers and "username" not in r.query for r in envd), (
        f"envd {ENVD_VERSION} has a default user; the SDK names none")
