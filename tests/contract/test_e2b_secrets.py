"""Acceptance 4: the API key and envd access tokens never reach a log line, an exception or a handle."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable

import pytest

from durable_sandbox.providers.contract import ProviderError, SandboxHandle, SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import E2BProvider
from tests.contract.e2b_support import RecordingSleep
from tests.fakes.e2b_state import FakeState

SENTINEL_KEY = "e2b_SENTINEL_do_not_leak_4f9c2a7d1e"


async def test_no_secret_in_logs_exceptions_or_handles(fake_e2b: FakeState, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("E2B_API_KEY", SENTINEL_KEY)
    monkeypatch.setenv("E2B_API_URL", fake_e2b.api_url)
    monkeypatch.setenv("E2B_SANDBOX_URL", fake_e2b.sandbox_url)
    fake_e2b.api_key = SENTINEL_KEY
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "durable_sandbox"):
        caplog.set_level(logging.DEBUG, logger=name)

    provider = E2BProvider(sleep=RecordingSleep())  # configured from the environment, as in production
    errors: list[BaseException] = []
    handles: list[SandboxHandle] = []
    tokens: list[str] = []

    async def expect_error(attempt: Awaitable[object]) -> None:
        try:
            await attempt
        except ProviderError as exc:
            errors.append(exc)
        else:
            pytest.fail("expected a provider error")

    def call(type_: str, **args: object) -> ToolCall:
        return ToolCall(operation_id=f"op-{len(fake_e2b.requests)}", type=type_, args=args)

    fake_e2b.fail_create(429, retry_after="1")
    handle = await provider.provision(SandboxSpec(owner="o", env={"SECRET": "s3cr3t-env-value"}), lease_seconds=300)
    handles.append(handle)
    tokens.append(fake_e2b.sandboxes[handle.id].access_token)
    await provider.execute(handle, call("write_file", path="a.txt", contents="x"))
    await provider.execute(handle, call("read_file", path="a.txt"))
    await provider.execute(handle, call("read_file", path="missing.txt"))
    await provider.execute(handle, call("shell", command="echo hi; echo err >&2"))
    snapshot_id = await provider.snapshot(handle, operation_id="snap")
    restored = await provider.restore(snapshot_id, SandboxSpec(owner="o"), lease_seconds=300)
    handles.append(restored)
    tokens.append(fake_e2b.sandboxes[restored.id].access_token)
    handles.extend(await provider.list_sandboxes("o"))
    handles.append(await provider.renew_lease(handle, 600))

    fake_e2b.corrupt_next_stream("malformed")
    await expect_error(provider.execute(handle, call("shell", command="true")))
    fake_e2b.corrupt_next_stream("truncated")
    await expect_error(provider.execute(handle, call("shell", command="true")))
    fake_e2b.end_stream_with_error("internal", "boom")
    await expect_error(provider.execute(handle, call("shell", command="true")))
    fake_e2b.fail_create(503, times=10)
    await expect_error(provider.provision(SandboxSpec(), lease_seconds=60))
    fake_e2b.kill(restored.id)
    await expect_error(provider.execute(restored, call("shell", command="true")))
    fake_e2b.api_key = "rotated"  # the configured key is now wrong: the 401 path must not echo it either
    await expect_error(provider.provision(SandboxSpec(), lease_seconds=60))
    fake_e2b.api_key = SENTINEL_KEY
    await provider.delete_snapshot(snapshot_id)
    await provider.destroy(handle)
    await provider.aclose()

    secrets = [SENTINEL_KEY, *tokens]
    assert len(errors) == 6 and len(caplog.records) > 10
    assert any(r.name.startswith("httpx") for r in caplog.records), "httpx's own logging was captured"
    texts = [r.getMessage() for r in caplog.records]
    texts += ["".join(traceback.format_exception(e)) + repr(e) for e in errors]
    texts += [h.model_dump_json() + repr(h) for h in handles]
    texts.append(repr(provider))
    leaks = [(secret[:12] + "...", text[:200]) for text in texts for secret in secrets if secret in text]
    assert leaks == []
