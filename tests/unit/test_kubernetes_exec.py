"""The exec channel client (providers/kubernetes_exec.py) and the provider's in-Pod scripts through it, against
an in-process WebSocket endpoint that speaks the API server's exec protocol (v5/v4 channels, the status
message) and runs the command for real as a subprocess of this machine.

This is the protocol's unit test: the real API server and kubelet are in tests/e2e (the handshake, its
refusals and the RBAC it needs in test_kubernetes_provider_apiserver.py; whole calls in
test_kubernetes_provider_node.py, on the node). The endpoint follows the protocol as the kubelet's streaming
server implements it: binary messages prefixed by the channel byte, an empty first message per channel,
``[255, 0]`` (v5) closing stdin, and a ``metav1.Status`` on channel 3 before the close.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType, web
from kubernetes.aio import client as k8s

from durable_sandbox.providers import kubernetes_scripts as scripts
from durable_sandbox.providers.kubernetes_exec import (
    ExecFailed,
    ExecRejected,
    PodExec,
    StreamBroken,
    exit_code_of,
)

STATUS_SUCCESS = {"metadata": {}, "status": "Success"}


def status_exit(code: int) -> dict[str, Any]:
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


class ExecEndpoint:
    def __init__(self, protocols: tuple[str, ...]) -> None:
        self.protocols = protocols
        self.requests: list[dict[str, Any]] = []
        self.mode = "normal"  # or "no-status", "cannot-run"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["pod"] == "missing":
            raise web.HTTPNotFound(text='{"message": "pods \\"missing\\" not found"}')
        ws = web.WebSocketResponse(protocols=self.protocols)
        await ws.prepare(request)
        command = request.query.getall("command")
        self.requests.append({"query": list(request.query.items()), "protocol": ws.ws_protocol,
                              "authorization": request.headers.get("Authorization")})
        for channel in (1, 2):
            await ws.send_bytes(bytes((channel,)))
        if self.mode == "cannot-run":
            await ws.send_bytes(b"\x03" + json.dumps({"status": "Failure", "reason": "InternalError",
                                                      "message": 'exec: "sh": executable file not found'}).encode())
            await ws.close()
            return ws
        proc = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        async def pump_in() -> None:
            async for message in ws:
                if message.type != WSMsgType.BINARY:
                    continue
                data: bytes = message.data
                if data[:1] == b"\x00":
                    proc.stdin.write(data[1:])  # type: ignore[union-attr]
                    await proc.stdin.drain()  # type: ignore[union-attr]
                elif data == b"\xff\x00":
                    proc.stdin.close()  # type: ignore[union-attr]

        async def pump_out(stream: asyncio.StreamReader, channel: int) -> None:
            while chunk := await stream.read(65536):
                await ws.send_bytes(bytes((channel,)) + chunk)

        reader = asyncio.ensure_future(pump_in())
        await asyncio.gather(pump_out(proc.stdout, 1), pump_out(proc.stderr, 2))
        code = await proc.wait()
        reader.cancel()
        if self.mode != "no-status":
            await ws.send_bytes(b"\x03" + json.dumps(STATUS_SUCCESS if code == 0 else status_exit(code)).encode())
        await ws.close()
        return ws


@pytest.fixture(params=[("v5.channel.k8s.io", "v4.channel.k8s.io"), ("v4.channel.k8s.io",)], ids=["v5", "v4"])
async def endpoint(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ExecEndpoint, PodExec]]:
    served = ExecEndpoint(request.param)
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/exec", served.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.api_key = {"BearerToken": "token-xyz"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    api = k8s.ApiClient(configuration)
    try:
        yield served, PodExec(api)
    finally:
        await api.close()
        await runner.cleanup()


async def run(execs: PodExec, script: bytes, data: bytes = b"") -> tuple[int, bytes, bytes]:
    out, err = bytearray(), bytearray()

    async def stdin() -> AsyncIterator[bytes]:
        yield script
        for i in range(0, len(data), 100_000):
            yield data[i:i + 100_000]

    outcome = await execs.run("ns", "pod", "sandbox", scripts.boot_command(script), stdout=out.extend,
                              stderr=err.extend, stdin=stdin())
    return outcome.exit_code, bytes(out), bytes(err)


def test_exit_codes_come_only_from_the_status() -> None:
    assert exit_code_of(STATUS_SUCCESS) == 0
    assert exit_code_of(status_exit(3)) == 3
    assert exit_code_of({"status": "Failure", "reason": "InternalError", "message": "x"}) is None
    assert exit_code_of({"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": [
        {"reason": "ExitCode", "message": "not a number"}]}}) is None


async def test_a_call_runs_with_its_exit_code_output_and_authentication(endpoint: tuple[ExecEndpoint, PodExec],
                                                                       tmp_path: Path) -> None:
    served, execs = endpoint
    script = scripts.shell('printf out; printf err >&2; printf %s "$SECRET_VALUE"; exit 7', tag="t", cwd=None,
                           env={"SECRET_VALUE": "s3cr3t"}, workspace=str(tmp_path))
    assert await run(execs, script) == (7, b"outs3cr3t", b"err")
    request = served.requests[-1]
    assert request["authorization"] == "Bearer token-xyz"
    assert request["protocol"] == served.protocols[0] == execs.negotiated
    query = dict(request["query"])
    assert query["container"] == "sandbox" and query["stdin"] == "true"
    assert "s3cr3t" not in json.dumps(request["query"]) and "printf" not in json.dumps(request["query"]), \
        "neither the command nor its env is in the exec URL"


async def test_files_stream_both_ways_binary_safe(endpoint: tuple[ExecEndpoint, PodExec], tmp_path: Path) -> None:
    _, execs = endpoint
    data = bytes(range(256)) * 4000  # 1 MB, every byte value
    code, _, err = await run(execs, scripts.write_file("d/blob", len(data), workspace=str(tmp_path)), data)
    assert code == 0, err
    assert (tmp_path / "d" / "blob").read_bytes() == data
    code, out, _ = await run(execs, scripts.read_file("d/blob", workspace=str(tmp_path), keep=len(data)))
    assert (code, out) == (0, data)
    assert (await run(execs, scripts.read_file("nope", workspace=str(tmp_path))))[0] == scripts.NOT_FOUND


async def test_a_stream_without_a_status_is_never_a_result(endpoint: tuple[ExecEndpoint, PodExec],
                                                           tmp_path: Path) -> None:
    served, execs = endpoint
    served.mode = "no-status"
    with pytest.raises(StreamBroken, match="may or may not have run"):
        await run(execs, scripts.shell("true", tag="t", cwd=None, env={}, workspace=str(tmp_path)))


async def test_a_command_that_cannot_run_and_a_missing_pod(endpoint: tuple[ExecEndpoint, PodExec]) -> None:
    served, execs = endpoint
    served.mode = "cannot-run"
    with pytest.raises(ExecFailed, match="executable file not found") as failed:
        await execs.run("ns", "pod", "sandbox", ["sh"], stdout=print, stderr=print)
    assert failed.value.reason == "InternalError"
    with pytest.raises(ExecRejected) as missing:
        await execs.run("ns", "missing", "sandbox", ["sh"], stdout=print, stderr=print)
    assert missing.value.status == 404


async def test_the_providers_timeout_kills_the_calls_processes(endpoint: tuple[ExecEndpoint, PodExec],
                                                               tmp_path: Path) -> None:
    """The provider's shell call, through the exec client, on this machine: a timeout answers 124 with the
    output so far and a second exec kills every process of the call (the setsid one too)."""
    from durable_sandbox.providers.contract import SandboxHandle, ToolCall
    from durable_sandbox.providers.kubernetes import KubernetesProvider

    _, execs = endpoint
    provider = KubernetesProvider(namespace="ns", environ={})
    provider.workspace = str(tmp_path)
    provider._api_client, provider._exec, provider._core = execs.api_client, execs, _one_pod()
    handle = SandboxHandle(id="ns/pod", provider="kubernetes", metadata={"uid": _UID})
    marker = "dsb-timeout-" + tmp_path.name
    where = str(tmp_path)  # pytest makes it from the resolved temp root
    result = await provider.execute(handle, ToolCall(operation_id="slow", type="shell", args={
        "command": f"echo started; sleep 3017 & setsid sh -c 'sleep 3029; echo {marker}' & wait", "timeout": 1}))
    assert result.exit_code == 124 and result.stdout == "started\n"
    assert result.stderr.endswith("Command timed out after 1 seconds")
    assert _sleepers() == [], "every process of the timed-out call was killed"
    done = await provider.execute(handle, ToolCall(operation_id="quick", type="shell", args={"command": "pwd"}))
    assert (done.exit_code, done.stdout.strip()) == (0, where)


async def test_the_providers_shell_output_reaches_the_sink_while_the_call_runs(endpoint: tuple[ExecEndpoint, PodExec],
                                                                              tmp_path: Path) -> None:
    """output_streaming: each chunk of the exec's stdout and stderr reaches the caller's sink as it comes (the command
    waits for a file made only once its first line was seen), and the pieces joined are the result's streams."""
    from durable_sandbox.providers.contract import Capability, SandboxHandle, ToolCall
    from durable_sandbox.providers.kubernetes import KubernetesProvider
    from durable_sandbox.providers.streaming import Stream, streaming_to

    _, execs = endpoint
    provider = KubernetesProvider(namespace="ns", environ={})
    assert provider.capabilities().supports(Capability.OUTPUT_STREAMING)
    provider.workspace = str(tmp_path)
    provider._api_client, provider._exec, provider._core = execs.api_client, execs, _one_pod()
    handle = SandboxHandle(id="ns/pod", provider="kubernetes", metadata={"uid": _UID})
    pieces: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

    def sink(stream: Stream, data: bytes) -> None:
        pieces[stream].append(data)
        if b"first" in b"".join(pieces["stdout"]) and not (tmp_path / "go").exists():
            (tmp_path / "go").write_text("")

    command = ("echo first; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
               "if [ -e go ]; then echo second; else echo 'gave up'; fi; printf oops >&2")
    with streaming_to(sink):
        result = await provider.execute(handle, ToolCall(operation_id="streamed", type="shell", args={"command": command}))
    assert result.outcome == (0, "first\nsecond\n", "oops")
    assert b"".join(pieces["stdout"]).decode() == result.stdout and b"".join(pieces["stderr"]).decode() == result.stderr


_UID = "uid-of-ns-pod"


def _one_pod() -> Any:
    """The API the provider reads Pod ``ns/pod`` from before and after each exec (the exec itself runs here)."""
    from tests.fakes.core_pods import FakeCore

    core = FakeCore()
    core.stamp(pod := {"metadata": {"namespace": "ns", "name": "pod"}}, uid=_UID)
    core.pods[("ns", "pod")] = pod
    return core


def _sleepers() -> list[str]:
    return [p.name for p in Path("/proc").iterdir()
            if p.name.isdigit() and _cmdline(p).strip() in ("sleep 3017", "sleep 3029")]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def test_a_snapshot_streams_the_workspace_as_tar_to_the_store_and_a_failed_tar_stores_nothing(
        endpoint: tuple[ExecEndpoint, PodExec], tmp_path: Path, s3_server: Any) -> None:
    import io
    import tarfile

    from durable_sandbox.providers.contract import ProviderError, SandboxHandle
    from durable_sandbox.providers.kubernetes import KubernetesProvider
    from durable_sandbox.providers.s3_snapshots import S3SnapshotStore, SnapshotName

    _, execs = endpoint
    store = S3SnapshotStore(s3_server.config("kexec-" + tmp_path.name[-8:].lower().replace("_", "-")))
    await store.ensure_bucket()
    provider = KubernetesProvider(namespace="ns", environ={}, store=store)
    workspace = tmp_path / "ws"
    (workspace / "d").mkdir(parents=True)
    (workspace / "d" / "big.bin").write_bytes(bytes(range(256)) * 40_000)  # 10 MB: several reads, one part
    provider.workspace = str(workspace)
    provider._api_client, provider._exec, provider._core = execs.api_client, execs, _one_pod()
    handle = SandboxHandle(id="ns/pod", provider="kubernetes", metadata={"owner": "ns/uid", "labels": {}, "uid": _UID})
    try:
        snapshot = await provider.snapshot(handle, operation_id="op-snap")
        assert await provider.snapshot(handle, operation_id="op-snap") == snapshot, "reconciled by operation id"
        name = SnapshotName.parse(snapshot)
        assert name is not None
        data = b"".join([c async for c in await store.get(name)])
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.extractfile("./d/big.bin")
            assert member is not None and member.read() == bytes(range(256)) * 40_000
        provider.workspace = str(tmp_path / "no-such-workspace")  # tar cannot run: the upload is aborted
        with pytest.raises(ProviderError, match="tar exited"):
            await provider.snapshot(handle, operation_id="op-broken")
        s3 = await store._s3()
        listed = await s3.list_objects_v2(Bucket=store.config.bucket)
        assert [o["Key"] for o in listed.get("Contents", [])] == [store.key(name)], "nothing of the failed taking"
        await provider.delete_snapshot(snapshot)
        await provider.delete_snapshot(snapshot)
    finally:
        await store.aclose()


async def test_a_snapshot_past_the_limit_stops_the_exec_and_stores_nothing(
        endpoint: tuple[ExecEndpoint, PodExec], tmp_path: Path, s3_server: Any) -> None:
    """Issue 32, item 4, through the real exec client: the archive passes the limit while tar still writes; the
    upload is aborted, the exec ends (its websocket closed while the output still streams) and nothing is stored."""
    import os

    from durable_sandbox.providers.archive_limit import ArchiveTooLarge
    from durable_sandbox.providers.contract import SandboxHandle
    from durable_sandbox.providers.kubernetes import KubernetesProvider
    from durable_sandbox.providers.s3_snapshots import S3SnapshotStore

    _, execs = endpoint
    store = S3SnapshotStore(s3_server.config("klim-" + tmp_path.name[-8:].lower().replace("_", "-")))
    await store.ensure_bucket()
    provider = KubernetesProvider(namespace="ns", environ={}, store=store, snapshot_limit=4 * 2**20)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "noise.bin").write_bytes(os.urandom(48 * 2**20))  # what a tar without sparse support streams
    provider.workspace = str(workspace)
    provider._api_client, provider._exec, provider._core = execs.api_client, execs, _one_pod()
    handle = SandboxHandle(id="ns/pod", provider="kubernetes", metadata={"owner": "ns/uid", "labels": {}, "uid": _UID})
    try:
        with pytest.raises(ArchiveTooLarge, match="larger than the limit of 4 MiB"):
            await asyncio.wait_for(provider.snapshot(handle, operation_id="op-big"), 60)
        s3 = await store._s3()
        listed = await s3.list_objects_v2(Bucket=store.config.bucket)
        assert listed.get("Contents", []) == [], "nothing of the taking past the limit"
    finally:
        await store.aclose()
