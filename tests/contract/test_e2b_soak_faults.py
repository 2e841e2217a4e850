"""The fake E2B's fault switches the chaos soak (tests/soak) uses, each against the e2b provider: any API request
failing, a request stalled past the client's timeout, and a sandbox killed while a command runs in it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_sandbox.providers.contract import ProviderError, SandboxSpec, ToolCall
from durable_sandbox.providers.e2b import E2BProvider
from tests.contract.e2b_support import make_provider
from tests.fakes.e2b_server import FakeE2BServer
from tests.fakes.e2b_state import FakeState
from tests.unit.process_support import eventually

SPEC = SandboxSpec(owner="soak-fault-tests")
# Waits are on conditions; this only bounds a wait that would otherwise hang. Generous: on a loaded machine
# (load 2-3 and more, other suites sharing the cores) a stream's end takes far longer than it does alone.
DEADLINE = 120.0


async def _until(condition: Callable[[], bool], what: str) -> None:
    await eventually(condition, what, DEADLINE)


async def test_a_failed_request_of_any_route_is_retried(e2b: E2BProvider, fake_e2b: FakeState) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    fake_e2b.fail_requests(502, times=2)
    await e2b.renew_lease(handle, 600)  # POST /sandboxes/{id}/timeout: answered 502 twice, then done
    assert fake_e2b.request_faults_fired == 2
    statuses = [r.status for r in fake_e2b.calls("POST", f"/sandboxes/{handle.id}/timeout")]
    assert statuses == [502, 502, 204]


async def test_a_stalled_request_times_out_and_its_retry_is_answered(fake_e2b: FakeState) -> None:
    e2b = make_provider(fake_e2b, timeout=0.5)
    try:
        fake_e2b.stall_requests()
        handle = await e2b.provision(SPEC, lease_seconds=300)  # the first create gets no answer in time
    finally:
        await e2b.aclose()
    assert fake_e2b.stalls_fired == 1
    assert fake_e2b.live_sandboxes() == [handle.id]  # the stalled create was not processed: one sandbox
    creates = fake_e2b.calls("POST", "/v2/sandboxes")
    assert len(creates) == 2 and creates[1].status == 201
    # The stalled request was answered (unprocessed) once the client had sent it again.
    await _until(lambda: creates[0].status == 504, "the stalled create to be answered")


async def test_killing_a_sandbox_kills_its_commands_and_cuts_their_streams(
    e2b: E2BProvider, fake_e2b: FakeState
) -> None:
    handle = await e2b.provision(SPEC, lease_seconds=300)
    pid_file = fake_e2b.root / "pid"
    # A command that never ends by itself: only the kill can end the call.
    call = ToolCall(operation_id="op-1", type="shell", args={"command": f"echo $$ > {pid_file}; exec sleep 600"})
    running = asyncio.create_task(e2b.execute(handle, call))
    await _until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the command to start")
    pid = int(pid_file.read_text())
    fake_e2b.kill(handle.id)
    # Not a completed call with some exit code: the sandbox and the process went away under it.
    with pytest.raises(ProviderError):
        await asyncio.wait_for(running, DEADLINE)
    await _until(lambda: not _alive(pid), "the command to die with its sandbox")


async def test_stopping_the_fake_kills_the_commands_still_running_in_its_sandboxes(tmp_path: Path) -> None:
    """A soak's fake E2B once left a command waiting on a gate file running for hours after the soak."""
    pid_file = tmp_path / "pid"
    state = FakeState(root=tmp_path / "fake")
    async with FakeE2BServer(state):
        e2b = make_provider(state)
        try:
            handle = await e2b.provision(SPEC, lease_seconds=300)
            call = ToolCall(operation_id="op-1", type="shell", args={"command": f"echo $$ > {pid_file}; exec sleep 300"})
            running = asyncio.create_task(e2b.execute(handle, call))
            await _until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", "the command to start")
            pid = int(pid_file.read_text())
            running.cancel()  # the client goes away first, as an operator killed mid-call does
            with contextlib.suppress(BaseException):
                await running
        finally:
            await e2b.aclose()
        assert _alive(pid)  # a dropped stream does not end an E2B command
    await _until(lambda: not _alive(pid), "the command to die with the fake")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child not yet reaped by the fake's loop is a zombie: dead for this purpose.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0] != "Z"
    return False


def test_the_request_timeout_comes_from_the_environment(fake_e2b: FakeState) -> None:
    env = {"E2B_API_KEY": fake_e2b.api_key, "E2B_API_URL": fake_e2b.api_url}
    assert E2BProvider.configuration_problems({**env, "E2B_REQUEST_TIMEOUT": "2.5"}) == []
    assert E2BProvider(environ={**env, "E2B_REQUEST_TIMEOUT": "2.5"})._client.timeout.read == 2.5
    assert E2BProvider(environ=env)._client.timeout.read == 30.0
    for bad in ("soon", "0", "-1", "inf"):
        assert E2BProvider.configuration_problems({**env, "E2B_REQUEST_TIMEOUT": bad}) == [
            f"Sandbox provider [e2b]: E2B_REQUEST_TIMEOUT must be a positive number of seconds, got {bad!r}"
        ]
    # ... and so does the number of requests sent for a transient failure (E2B_RETRY_ATTEMPTS).
    assert E2BProvider(environ={**env, "E2B_RETRY_ATTEMPTS": "2"}).retry.attempts == 2
    assert E2BProvider(environ=env).retry.attempts == 5
    for bad in ("many", "0", "21"):
        assert E2BProvider.configuration_problems({**env, "E2B_RETRY_ATTEMPTS": bad}) == [
            f"Sandbox provider [e2b]: E2B_RETRY_ATTEMPTS must be a whole number from 1 to 20, got {bad!r}"
        ]
