"""Issue 14 item 5: where the provider sends each request when no URL is overridden, as E2B's SDK does:
``https://api.<E2B_DOMAIN>`` for the API; for envd the shared host ``https://sandbox.<domain>`` on E2B's own
domains and ``https://49983-<id>.<domain>`` elsewhere, always with the routing headers. The requests still
reach the fake server: a transport records the URL the provider chose, then delivers it to the fake."""

from __future__ import annotations

import httpx
import pytest

from durable_sandbox.providers.contract import SandboxHandle, SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import E2BProvider
from tests.contract.e2b_support import RecordingSleep
from tests.fakes import e2b_server
from tests.fakes.e2b_state import FakeState


class Rerouting(httpx.AsyncBaseTransport):
    """Records the URL of each request, then sends it to the fake (API host or envd host)."""

    def __init__(self, fake: FakeState) -> None:
        self.fake = fake
        self.urls: list[str] = []
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url.copy_with(query=None)))
        target = httpx.URL(self.fake.api_url if request.url.host.startswith("api.") else self.fake.sandbox_url)
        request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port)
        request.headers["Host"] = f"{target.host}:{target.port}"
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def urls_of_a_create_and_a_file_call(fake: FakeState, environ: dict[str, str]) -> tuple[list[str], SandboxHandle]:
    transport = Rerouting(fake)
    provider = E2BProvider(environ={"E2B_API_KEY": fake.api_key, **environ}, transport=transport,
                           sleep=RecordingSleep())
    try:
        handle = await provider.provision(SandboxSpec(), lease_seconds=60)
        await provider.execute(handle, ToolCall(operation_id="w", type="write_file", args={"path": "a", "contents": "x"}))
    finally:
        await provider.aclose()
    [write] = fake.calls("POST", "/files")
    assert write.headers["E2b-Sandbox-Id"] == handle.id and write.headers["E2b-Sandbox-Port"] == "49983"
    return transport.urls, handle


@pytest.mark.parametrize(("domain", "envd"), [
    ("e2b.app", "https://sandbox.e2b.app"),
    ("e2b.dev", "https://sandbox.e2b.dev"),
    ("sandboxes.corp.example", "https://49983-{id}.sandboxes.corp.example"),
])
async def test_urls_follow_e2b_domain(fake_e2b: FakeState, domain: str, envd: str) -> None:
    urls, handle = await urls_of_a_create_and_a_file_call(fake_e2b, {"E2B_DOMAIN": domain})
    assert urls == [f"https://api.{domain}/v2/sandboxes", envd.format(id=handle.id) + "/files"]


async def test_e2b_sandbox_url_wins_over_the_domain(fake_e2b: FakeState) -> None:
    urls, _ = await urls_of_a_create_and_a_file_call(
        fake_e2b, {"E2B_DOMAIN": "e2b.dev", "E2B_SANDBOX_URL": "https://envd.proxy.example"})
    assert urls == ["https://api.e2b.dev/v2/sandboxes", "https://envd.proxy.example/files"]


async def test_the_domain_in_the_create_answer_wins(fake_e2b: FakeState, monkeypatch: pytest.MonkeyPatch) -> None:
    created = e2b_server._created
    monkeypatch.setattr(e2b_server, "_created", lambda sandbox: {**created(sandbox), "domain": "e2b.dev"})
    urls, handle = await urls_of_a_create_and_a_file_call(fake_e2b, {"E2B_DOMAIN": "corp.example"})
    assert urls == ["https://api.corp.example/v2/sandboxes", "https://sandbox.e2b.dev/files"]
    assert handle.metadata["domain"] == "e2b.dev"
