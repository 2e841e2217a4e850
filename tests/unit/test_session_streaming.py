"""Issue 35: a shell call's stdout and stderr reach its caller while it runs (server-sent events from the call API,
the client's ``stream()``), the journaled result unchanged; a call answered from the journal streams its journaled
output at once; a refusal before any output is the plain JSON refusal with its status; a provider without
``output_streaming`` gives its output at the end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from durable_sandbox.client import AsyncSandboxClient, CallResult, Output, SandboxCallError, SandboxClient
from durable_sandbox.providers.contract import Capability, ProviderCapabilities
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sessions.http import create_app
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import local_gate, service, serving_call_api

PATH = "/v1/namespaces/demo/sandboxes/box/shell"
AUTH = {"Authorization": "Bearer good-token", "Accept": "text/event-stream"}
# Prints, then waits (at most 30 s) for a file the test makes only once it has seen that first output.
WAITS = ("printf 'first\\n'; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
         "if [ -e go ]; then printf 'second\\n'; else printf 'gave up\\n'; fi; printf 'oops' >&2")


def events(lines: list[str]) -> list[tuple[str, Any]]:
    found, event = [], "message"
    for line in lines:
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            found.append((event, json.loads(line[len("data: "):])))
    return found


async def test_output_reaches_the_caller_while_the_call_runs_and_the_result_is_the_journaled_one(tmp_path: Path) -> None:
    async with serving_call_api(tmp_path) as (port, gate), httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        workspace = Path(gate.handle.metadata["workspace"])
        seen: list[str] = []
        async with http.stream("POST", PATH, headers=AUTH, json={"operationId": "s1", "command": WAITS}) as answer:
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
            async for line in answer.aiter_lines():
                seen.append(line)
                if line == 'data: {"stream":"stdout","text":"first\\n"}':  # the first piece of output
                    assert not (workspace / "go").exists()  # the call is still waiting: this came while it ran
                    (workspace / "go").write_text("")
        got = events(seen)
        assert got[0] == ("output", {"stream": "stdout", "text": "first\n"})
        outputs = "".join(d["text"] for e, d in got if e == "output" and d["stream"] == "stdout")
        name, result = got[-1]
        assert name == "result" and result["exitCode"] == 0 and result["stdout"] == outputs == "first\nsecond\n"
        assert result["stderr"] == "oops" and not result["replayed"]

        plain = await http.post(PATH, headers={"Authorization": "Bearer good-token"},
                                json={"operationId": "s1", "command": WAITS})
        assert plain.json() == {**result, "replayed": True}  # the journaled answer, as a request without the header


async def test_a_call_answered_from_the_journal_streams_its_journaled_output_at_once(tmp_path: Path) -> None:
    async with serving_call_api(tmp_path) as (port, _), httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        body = {"operationId": "s1", "command": "echo out; echo err >&2; exit 3"}
        first = await http.post(PATH, headers={"Authorization": "Bearer good-token"}, json=body)
        again = await http.post(PATH, headers=AUTH, json=body)
    assert first.json()["exitCode"] == 3
    assert events(again.text.splitlines()) == [
        ("output", {"stream": "stdout", "text": "out\n"}), ("output", {"stream": "stderr", "text": "err\n"}),
        ("result", {**first.json(), "replayed": True})]


async def test_a_refusal_before_any_output_is_plain_json_with_its_status(tmp_path: Path) -> None:
    async with serving_call_api(tmp_path) as (port, _), httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        body = {"operationId": "s1", "command": "touch ran"}
        forbidden = await http.post(PATH, headers={**AUTH, "Authorization": "Bearer other-token"}, json=body)
        missing = await http.post(PATH.replace("/box/", "/missing/"), headers=AUTH, json=body)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["reason"] == "Forbidden"
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"


class NotStreaming(LocalProvider):
    def capabilities(self) -> ProviderCapabilities:
        caps = super().capabilities()
        return caps.model_copy(update={"supported": caps.supported - {Capability.OUTPUT_STREAMING}})


async def test_a_provider_without_output_streaming_gives_the_output_at_the_end(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home", NotStreaming(tmp_path / "home"))
    app = create_app(service(SqliteStore(tmp_path / "runs.db"), gate))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sessions") as http:
        answer = await http.post(PATH, headers=AUTH, json={"operationId": "s1", "command": "echo a; echo b"})
    got = events(answer.text.splitlines())
    assert got == [("output", {"stream": "stdout", "text": "a\nb\n"}),
                   ("result", {"operationId": "s1", "exitCode": 0, "stdout": "a\nb\n", "stderr": "", "replayed": False})]


async def test_the_clients_stream_yields_output_while_it_runs_then_the_result(tmp_path: Path) -> None:
    async with serving_call_api(tmp_path) as (port, gate):
        workspace = Path(gate.handle.metadata["workspace"])
        pieces: list[Output | CallResult] = []
        async with AsyncSandboxClient.attach("box", namespace="demo", url=f"http://127.0.0.1:{port}",
                                             token="good-token") as box:
            async for piece in box.stream(WAITS, operation_id="s1"):
                pieces.append(piece)
                if isinstance(piece, Output) and "first" in piece.text:
                    assert not (workspace / "go").exists()
                    (workspace / "go").write_text("")
            refused = None
            try:
                async for _ in box.stream("true", operation_id="bad id!"):
                    pass
            except SandboxCallError as exc:
                refused = exc
        result = pieces[-1]
        assert isinstance(result, CallResult) and result.stdout == "first\nsecond\n" and result.stderr == "oops"
        assert "".join(p.text for p in pieces if isinstance(p, Output) and p.stream == "stdout") == result.stdout
        assert refused is not None and refused.status == 400

        def blocking() -> list[Output | CallResult]:
            with SandboxClient.attach("box", namespace="demo", url=f"http://127.0.0.1:{port}", token="good-token") as b:
                return list(b.stream(WAITS, operation_id="s1"))

        again = await asyncio.to_thread(blocking)  # the same id: the journaled output at once, not run again
        assert [p for p in again if isinstance(p, Output)] == [Output("stdout", "first\nsecond\n"), Output("stderr", "oops")]
        assert isinstance(again[-1], CallResult) and again[-1].replayed


def test_a_reconnected_stream_yields_only_the_output_not_yielded_before() -> None:
    from durable_sandbox.client.streaming import _Delivered

    delivered = _Delivered()
    assert delivered.new_part("stdout", "abc") == "abc"  # the first attempt, cut off after "abc"
    delivered.restart()
    assert delivered.new_part("stdout", "ab") == ""
    assert delivered.new_part("stdout", "cde") == "de"
    assert delivered.new_part("stderr", "x") == "x"
