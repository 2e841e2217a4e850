"""Each fault switch of the fake E2B server, and the error class and message the adapter turns it into."""

from __future__ import annotations

import pytest

from durable_sandbox.providers.contract import (
    ConfigurationError,
    ProviderError,
    ProvisionError,
    RateLimited,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    ToolCall,
    UnsupportedCapability,
)
from durable_sandbox.providers.e2b import E2BProvider, RetryPolicy, snapshot_name
from durable_sandbox.providers.e2b_connect import (
    ConnectProtocolError,
    ConnectStreamError,
    ConnectStreamTruncated,
)
from tests.contract.e2b_support import RecordingSleep, make_provider
from tests.fakes import e2b_server
from tests.fakes.e2b_state import FakeState, Sandbox, StreamFault

SPEC = SandboxSpec(owner="fault-tests")


def shell(command: str, op: str = "op-1", **args: object) -> ToolCall:
    return ToolCall(operation_id=op, type="shell", args={"command": command, **args})


# ------------------------------------------------------------------------------------------ kill / expiry


async def test_killed_sandbox_is_gone_for_every_envd_call(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    fake_e2b.kill(handle.id)
    with pytest.raises(SandboxGone, match=rf"Sandbox {handle.id} is gone: run shell call op-1 .* E2B answered 404"):
        await e2b.execute(handle, shell("true"))
    with pytest.raises(SandboxGone, match=r"read x.txt .* answered 404: The sandbox .* was not found"):
        await e2b.execute(handle, ToolCall(operation_id="op-2", type="read_file", args={"path": "x.txt"}))
    with pytest.raises(SandboxGone, match="renew lease"):
        await e2b.renew_lease(handle, 60)
    assert handle.id not in fake_e2b.live_sandboxes()


async def test_a_fresh_process_looks_the_token_up_and_sees_the_loss(fake_e2b: FakeState) -> None:
    first = make_provider(fake_e2b)
    handle = await first.provision(SPEC, lease_seconds=300)
    await first.aclose()
    second = make_provider(fake_e2b)  # a restarted worker: no cached access token
    try:
        assert (await second.execute(handle, shell("echo hi"))).outcome == (0, "hi\n", "")
        assert [r.path for r in fake_e2b.calls("GET", "/sandboxes/")] == [f"/sandboxes/{handle.id}"]
        fake_e2b.kill(handle.id)
        third = make_provider(fake_e2b)
        with pytest.raises(SandboxGone, match=rf"look up sandbox {handle.id}: E2B answered 404"):
            await third.execute(handle, shell("true"))
        await third.aclose()
    finally:
        await second.aclose()


async def test_ttl_expiry_by_advancing_the_fake_clock(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    fake_e2b.advance(299)
    assert (await e2b.execute(handle, shell("true"))).exit_code == 0
    fake_e2b.advance(2)
    with pytest.raises(SandboxGone):
        await e2b.execute(handle, shell("true"))
    assert fake_e2b.live_sandboxes() == []


async def test_renewal_moves_the_ttl(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    await e2b.renew_lease(handle, 1000)
    fake_e2b.advance(900)
    assert (await e2b.execute(handle, shell("true"))).exit_code == 0
    assert fake_e2b.calls("POST", f"/sandboxes/{handle.id}/timeout")[0].json == {"timeout": 1000}


async def test_expire_switch(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=3600)
    fake_e2b.expire(handle.id)
    with pytest.raises(SandboxGone, match="E2B answered 404"):
        await e2b.execute(handle, ToolCall(operation_id="w", type="write_file", args={"path": "a", "contents": "b"}))


# ------------------------------------------------------------------------------------------ create faults


async def test_429_on_create_is_retried_honouring_retry_after(fake_e2b: FakeState) -> None:
    sleep = RecordingSleep()
    provider = make_provider(fake_e2b, sleep=sleep)
    fake_e2b.fail_create(429, times=2, retry_after="3")
    handle = await provider.provision(SPEC, lease_seconds=60)
    assert fake_e2b.live_sandboxes() == [handle.id]
    assert sleep.delays == [3.0, 3.0], "Retry-After (3 s) beats the 0.5 s and 1 s backoff"
    await provider.aclose()


async def test_503_on_create_backs_off_exponentially_then_gives_up_retryably(fake_e2b: FakeState) -> None:
    sleep = RecordingSleep()
    provider = make_provider(fake_e2b, sleep=sleep, retry=RetryPolicy(attempts=4, initial_delay=0.5, max_delay=1.5))
    fake_e2b.fail_create(503, times=10)
    with pytest.raises(ProvisionError, match=r"create sandbox: E2B answered 503: injected fault 503 \(gave up after 4") as exc:
        await provider.provision(SPEC, lease_seconds=60)
    assert exc.value.retryable is True
    assert sleep.delays == [0.5, 1.0, 1.5], "doubling, capped at max_delay"
    assert fake_e2b.live_sandboxes() == []
    await provider.aclose()


async def test_retry_after_beyond_patience_is_reported_not_waited(fake_e2b: FakeState) -> None:
    sleep = RecordingSleep()
    provider = make_provider(fake_e2b, sleep=sleep)
    fake_e2b.fail_create(429, times=1, retry_after="3600")
    with pytest.raises(RateLimited, match="answered 429") as exc:  # the session waits it out (test_e2b_rate_limits.py)
        await provider.provision(SPEC, lease_seconds=60)
    assert exc.value.retryable is True and exc.value.retry_after == 3600.0 and sleep.delays == []
    await provider.aclose()


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (403, False), (409, True), (422, False)])
async def test_create_4xx_mapping(fake_e2b: FakeState, status: int, retryable: bool) -> None:
    sleep = RecordingSleep()
    provider = make_provider(fake_e2b, sleep=sleep)
    fake_e2b.fail_create(status)
    expected = ConfigurationError if status == 403 else ProvisionError
    with pytest.raises(expected, match=f"create sandbox: E2B answered {status}: injected fault {status}") as exc:
        await provider.provision(SPEC, lease_seconds=60)
    assert exc.value.retryable is retryable
    assert sleep.delays == []
    await provider.aclose()


async def test_unknown_template_is_not_retryable(e2b: E2BProvider) -> None:
    with pytest.raises(ProvisionError, match="template 'no-such' not found") as exc:
        await e2b.provision(SandboxSpec(template="no-such"), lease_seconds=60)
    assert exc.value.retryable is False


async def test_wrong_api_key_is_a_configuration_error(fake_e2b: FakeState) -> None:
    provider = make_provider(fake_e2b, api_key="e2b_wrong_key_0123")
    with pytest.raises(ConfigurationError, match="E2B answered 401: Invalid API key") as exc:
        await provider.provision(SPEC, lease_seconds=60)
    assert "e2b_wrong_key_0123" not in str(exc.value)
    await provider.aclose()


def test_missing_api_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="needs an API key: set E2B_API_KEY"):
        E2BProvider(environ={})


# ------------------------------------------------------------------------------------------ snapshot faults


async def test_lost_snapshot_response_is_reconciled_without_a_second_snapshot(fake_e2b: FakeState) -> None:
    sleep = RecordingSleep()
    provider = make_provider(fake_e2b, sleep=sleep)
    handle = await provider.provision(SPEC, lease_seconds=300)
    await provider.execute(handle, ToolCall(operation_id="w", type="write_file", args={"path": "a.txt", "contents": "1"}))
    fake_e2b.drop_connection_after_snapshot()
    snapshot_id = await provider.snapshot(handle, operation_id="snap-op-1")
    [snap] = fake_e2b.snapshots()
    assert snapshot_id == snap.id and snap.name == snapshot_name("snap-op-1")
    assert snap.builds == 1, "the retry must find the persisted snapshot instead of building it again"
    assert len(fake_e2b.calls("POST", f"/sandboxes/{handle.id}/snapshots")) == 1
    assert [r.query for r in fake_e2b.calls("GET", "/snapshots")] == [{"name": snap.name}] * 2
    assert len(sleep.delays) == 1
    await provider.aclose()


async def test_snapshot_names_are_derived_from_the_operation_id() -> None:
    assert snapshot_name("op") == snapshot_name("op") != snapshot_name("op2")
    assert snapshot_name("op").startswith("dsb-") and len(snapshot_name("op")) == 44


async def test_snapshot_deletion_encodes_the_id_and_treats_404_as_done(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    snapshot_id = await e2b.snapshot(handle, operation_id="s")
    assert "/" in snapshot_id and ":" in snapshot_id
    await e2b.delete_snapshot(snapshot_id)
    await e2b.delete_snapshot(snapshot_id)
    [first, second] = fake_e2b.calls("DELETE", "/templates/")
    assert first.raw_path == "/templates/" + snapshot_id.replace("/", "%2F").replace(":", "%3A")
    assert (first.status, second.status) == (204, 404)
    assert fake_e2b.snapshots() == []


# ------------------------------------------------------------------------------------------ stream faults


STREAM_FAULTS: list[tuple[StreamFault, type[ProviderError], str, bool]] = [
    ("malformed", ConnectProtocolError, "malformed Connect data envelope: payload is not JSON", False),
    ("compressed", ConnectProtocolError, "compressed frame, but no compression was negotiated", False),
    ("truncated", ConnectStreamTruncated, "may or may not have finished", True),
    ("missing_end", ConnectProtocolError, "finished without a process end event; the exit code is unknown", False),
    ("bad_event", ConnectProtocolError, r"unknown process event \[exit\]", False),
]


@pytest.mark.parametrize(("kind", "error", "message", "retryable"), STREAM_FAULTS, ids=[f[0] for f in STREAM_FAULTS])
async def test_broken_streams_are_errors_never_results(e2b: E2BProvider, fake_e2b: FakeState, kind: StreamFault,
                                                       error: type[ProviderError], message: str, retryable: bool) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    fake_e2b.corrupt_next_stream(kind)
    with pytest.raises(error, match=message) as exc:
        await e2b.execute(handle, shell("echo ran > effect.txt", op="op-broken"))
    assert str(exc.value).startswith(f"run shell call op-broken in sandbox {handle.id}: ")
    assert exc.value.retryable is retryable
    # The command did run: at-least-once is why the session journals op ids, not outcomes, before retrying.
    assert (await e2b.execute(handle, shell("cat effect.txt", op="op-check"))).outcome == (0, "ran\n", "")


@pytest.mark.parametrize(("code", "retryable"), [("unavailable", True), ("permission_denied", False)])
async def test_end_of_stream_error(e2b: E2BProvider, fake_e2b: FakeState, code: str, retryable: bool) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    fake_e2b.end_stream_with_error(code, "envd lost the process")
    with pytest.raises(ConnectStreamError) as exc:
        await e2b.execute(handle, shell("echo partial"))
    assert str(exc.value) == (f"run shell call op-1 in sandbox {handle.id}: "
                              f"envd ended the process stream with error [{code}]: envd lost the process")
    assert exc.value.retryable is retryable and exc.value.code == code


async def test_shell_timeout_is_sent_as_a_connect_deadline(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    result = await e2b.execute(handle, shell("echo started; echo warn >&2; sleep 30", timeout=0.5))
    assert result.outcome == (124, "started\n", "warn\nCommand timed out after 0.5 seconds")
    assert fake_e2b.calls("POST", "/process.Process/Start")[-1].headers["Connect-Timeout-Ms"] == "500"


# ------------------------------------------------------------------------------------------ capabilities


async def test_loss_injection_suspend_and_resume_are_refused_before_any_request(e2b: E2BProvider,
                                                                               fake_e2b: FakeState) -> None:
    handle = SandboxHandle(id="anything", provider="e2b")
    for attempt in (e2b.inject_loss(handle), e2b.suspend(handle), e2b.resume(handle)):
        with pytest.raises(UnsupportedCapability, match=r"Sandbox provider \[e2b\] does not support"):
            await attempt
    assert fake_e2b.requests == []


def test_capabilities() -> None:
    caps = E2BProvider(api_key="k", environ={}).capabilities()
    assert {c.value for c in caps.supported} == {
        "snapshot", "snapshot_deletion", "snapshot_reconciliation", "restore", "lease_reconciliation", "inventory"}
    assert caps.delivery_guarantee == "at_least_once_effects"
    assert caps.idempotent_destroy and caps.maximum_lease_seconds == 86_400


async def test_lease_beyond_the_maximum_is_refused_before_any_request(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    with pytest.raises(ValueError, match=r"lease must be a whole number of seconds in \[1, 86400\]"):
        await e2b.provision(SPEC, lease_seconds=86_401)
    assert fake_e2b.requests == []


async def test_an_answer_without_a_field_e2b_documents_is_a_clear_error(e2b: E2BProvider, fake_e2b: FakeState,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers are validated against the SDK's models: the missing field is named, no value is quoted."""
    def listed_without_state(sandbox: Sandbox) -> dict[str, object]:
        return {k: v for k, v in listed(sandbox).items() if k != "state"}

    listed = e2b_server._listed
    await e2b.provision(SPEC, lease_seconds=60)
    monkeypatch.setattr(e2b_server, "_listed", listed_without_state)
    with pytest.raises(ProviderError, match=r"E2B listed an entry that does not match its ListedSandbox model \(state: Field required\)") as exc:
        await e2b.list_sandboxes(SPEC.owner or "")
    assert SPEC.owner not in str(exc.value).split(": ", 1)[1], "values from the answer are not quoted"
