"""The Python client (durable_sandbox.client): a call whose connection drops, or that the server refuses as
retryable, is sent again with the same operation id; other refusals raise with the server's what/where/do;
credentials come from the kubeconfig."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from durable_sandbox.client import AsyncSandboxClient, SandboxCallError, SandboxClient
from durable_sandbox.client.credentials import CredentialsError, default_namespace, token_source

URL = "http://sessions.test"


def answer(body: dict[str, object]) -> httpx.Response:
    return httpx.Response(200, json={"operationId": body["operationId"], "exitCode": 0, "stdout": "ok\n"})


def flaky(failures: list[object]) -> tuple[list[dict[str, object]], httpx.MockTransport]:
    """A transport failing as ``failures`` says (an exception to raise, or a Response), then answering."""
    seen: list[dict[str, object]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append({**body, "auth": request.headers["authorization"]})
        if failures:
            failure = failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            assert isinstance(failure, httpx.Response)
            return failure
        return answer(body)

    return seen, httpx.MockTransport(handle)


def retryable(status: int) -> httpx.Response:
    return httpx.Response(status, json={"error": {"status": status, "reason": "Unavailable", "what": "not yet",
                                                  "where": "Sandbox demo/box", "do": "retry", "retry": True}})


def test_a_dropped_call_is_sent_again_with_the_same_operation_id() -> None:
    seen, transport = flaky([httpx.ConnectError("refused"), httpx.ReadError("reset"), retryable(503)])
    with SandboxClient.attach("box", namespace="demo", url=URL, token="t0k", transport=transport) as box:
        result = box.run("echo ok")
    assert result.stdout == "ok\n" and len(seen) == 4
    assert len({s["operationId"] for s in seen}) == 1 and str(seen[0]["operationId"]).startswith("c-")
    assert {s["auth"] for s in seen} == {"Bearer t0k"}


async def test_the_async_client_retries_the_same_way() -> None:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body["operationId"])
        if len(seen) == 1:
            raise httpx.RemoteProtocolError("server went away")
        return answer(body)

    client = AsyncSandboxClient.attach("box", namespace="demo", url=URL, token="t0k",
                                       transport=httpx.MockTransport(handle))
    async with client as box:
        result = await box.write_file("a.txt", "x", operation_id="w-1")
    assert result.operation_id == "w-1" and seen == ["w-1", "w-1"]


def test_a_refusal_that_is_not_retryable_raises_with_what_to_do() -> None:
    conflict = httpx.Response(409, json={"error": {"status": 409, "reason": "Conflict", "what": "held by Workflow 'build'",
                                                   "where": "Sandbox demo/box", "do": "retry once it has finished"}})
    seen, transport = flaky([conflict])
    with SandboxClient.attach("box", namespace="demo", url=URL, token="t0k", transport=transport) as box:
        with pytest.raises(SandboxCallError) as err:
            box.run("true")
    assert err.value.status == 409 and "held by Workflow 'build'" in str(err.value) and len(seen) == 1


def test_retrying_stops_at_its_deadline() -> None:
    seen, transport = flaky([httpx.ConnectError("refused")] * 1000)
    with SandboxClient.attach("box", namespace="demo", url=URL, token="t", transport=transport, retry_for=0.5) as box:
        with pytest.raises(httpx.ConnectError):
            box.run("true")
    assert 1 < len(seen) < 1000


def test_credentials_from_the_kubeconfig(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(yaml.safe_dump({
        "current-context": "sa", "contexts": [{"name": "sa", "context": {"user": "agent", "namespace": "team-a"}},
                                              {"name": "cert", "context": {"user": "admin"}}],
        "users": [{"name": "agent", "user": {"token": "from-kubeconfig"}},
                  {"name": "admin", "user": {"client-certificate-data": "..."}}]}))
    assert token_source(kubeconfig=str(config))() == "from-kubeconfig"
    assert default_namespace(kubeconfig=str(config)) == "team-a"
    with pytest.raises(CredentialsError, match="has no token"):
        token_source(kubeconfig=str(config), context="cert")
