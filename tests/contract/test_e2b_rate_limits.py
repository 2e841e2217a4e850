"""Issue 13: provider rate limits (HTTP 429) slow the calls down instead of failing runs.

The fake E2B server's rate limiter (``FakeState.throttle``) answers 429, with or without ``Retry-After``, to
the next N requests, unprocessed. The adapter honours Retry-After (or backs off), holds every later request
of the same provider back until the limit has passed (so concurrent runs slow down together), and when
its own retries run out reports :class:`RateLimited`, which a sandbox session waits out without spending
one of its attempts: a run under a rate limit that outlasts every retry budget still succeeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import durable_sandbox.sandboxes.retries as session_retries
from durable_sandbox.providers.contract import ProviderError, RateLimited, SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import RetryPolicy
from tests.contract.e2b_support import RecordingSleep, make_provider
from tests.fakes.e2b_state import FakeState
from tests.unit.sandbox_session_support import engine_for

SPEC = SandboxSpec(owner="rate-limit-tests")


class VirtualTime(RecordingSleep):
    """The adapter's clock and sleep: sleeping moves the clock, so waits are asserted, never waited out."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000.0

    def clock(self) -> float:
        return self.now

    async def __call__(self, seconds: float) -> None:
        await super().__call__(seconds)
        self.now += seconds


def shell(command: str, op: str) -> ToolCall:
    return ToolCall(operation_id=op, type="shell", args={"command": command})


async def test_a_429_on_a_tool_call_is_waited_out_as_retry_after_says(fake_e2b: FakeState) -> None:
    time = VirtualTime()
    provider = make_provider(fake_e2b, sleep=time, clock=time.clock)
    try:
        handle = await provider.provision(SPEC, lease_seconds=300)
        fake_e2b.throttle(2, retry_after="4", server="envd")
        result = await provider.execute(handle, shell("echo hi", "op-1"))
        assert result.outcome == (0, "hi\n", "")
        assert time.delays == [4.0, 4.0], "Retry-After (4 s) beats the 0.5 s and 1 s backoff"
        starts = fake_e2b.calls("POST", "/process.Process/Start")
        assert [r.status for r in starts] == [429, 429, 200], "the command ran once, after the limit"
        # Without Retry-After: exponential backoff.
        fake_e2b.throttle(2, server="envd")
        time.delays.clear()
        assert (await provider.execute(handle, shell("echo again", "op-2"))).exit_code == 0
        assert time.delays == [0.5, 1.0]
        await provider.destroy(handle)
    finally:
        await provider.aclose()


async def test_a_rate_limit_holds_back_every_later_request_of_the_provider(fake_e2b: FakeState) -> None:
    time = VirtualTime()
    provider = make_provider(fake_e2b, sleep=time, clock=time.clock, retry=RetryPolicy(attempts=1))
    try:
        handle = await provider.provision(SPEC, lease_seconds=300)
        fake_e2b.throttle(1, retry_after="10", server="api")
        with pytest.raises(RateLimited, match=r"renew lease .* answered 429: rate limit exceeded \(gave up after 1") as exc:
            await provider.renew_lease(handle, 600)
        assert exc.value.retry_after == 10.0 and exc.value.retryable is True
        assert isinstance(exc.value, ProviderError) and time.delays == []
        sent = len(fake_e2b.requests)
        # Another call, of another kind, made meanwhile: it waits what is left of the limit before it is sent.
        time.now += 3
        assert (await provider.execute(handle, shell("echo later", "op-3"))).outcome == (0, "later\n", "")
        assert time.delays == [7.0]
        assert [r.status for r in fake_e2b.requests[sent:]] == [200], "nothing was sent into the limit"
        # Once the limit has passed nothing waits.
        assert (await provider.execute(handle, shell("true", "op-4"))).exit_code == 0
        assert time.delays == [7.0]
        await provider.destroy(handle)
    finally:
        await provider.aclose()


async def test_a_429_beyond_the_adapters_patience_is_reported_as_rate_limited(fake_e2b: FakeState) -> None:
    sleep = RecordingSleep()
    provider = make_provider(fake_e2b, sleep=sleep)
    try:
        fake_e2b.throttle(1, retry_after="3600", server="api")
        with pytest.raises(RateLimited, match="create sandbox: E2B answered 429") as exc:
            await provider.provision(SPEC, lease_seconds=60)
        assert exc.value.retry_after == 3600.0 and sleep.delays == []
        assert fake_e2b.live_sandboxes() == []
    finally:
        await provider.aclose()


async def test_a_rate_limit_outlasting_every_retry_budget_slows_the_run_but_does_not_fail_it(
        fake_e2b: FakeState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Retry-After 0 and tiny backoffs keep the test fast; what matters is the count: more 429s in a row than
    # the adapter's attempts times the session's attempts, which failed the run before.
    monkeypatch.setattr(session_retries, "FIRST_RETRY_DELAY", 0.0)
    adapter_attempts = 2
    throttled = adapter_attempts * session_retries.TRANSIENT_ATTEMPTS * 2
    provider = make_provider(fake_e2b, retry=RetryPolicy(attempts=adapter_attempts, initial_delay=0.0, max_delay=0.0))
    calls = [{"type": "shell", "command": "echo one"}, {"type": "shell", "command": "echo two"}]
    engine = engine_for(tmp_path / "runs.db", {"e2b": provider})
    try:
        fake_e2b.throttle(throttled, retry_after="0")
        state = await engine.run("sandbox-agent", {"toolCalls": calls, "sandbox": {"provider": "e2b"}}, run_id="limited")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    assert [(r["exitCode"], r["stdout"]) for r in state.result["toolResults"]] == [(0, "one\n"), (0, "two\n")]
    limited = [r for r in fake_e2b.requests if r.status == 429]
    assert len(limited) == throttled, "every 429 was answered to a request the run then repeated"
    assert fake_e2b.throttled == 0 and fake_e2b.live_sandboxes() == []
