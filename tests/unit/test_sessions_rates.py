"""Calls per second per caller (sessions/rates.py): a caller over its rate is refused with 429, Retry-After and
what to do, before anything is read or run; another caller is not affected; the client waits as told."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest

from durable_sandbox.client import SandboxClient
from durable_sandbox.client.wire import _retry_after
from durable_sandbox.sandboxes.rewind_journal import rewind_of
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.http import create_app
from durable_sandbox.sessions.journal import calls_run_id
from durable_sandbox.sessions.models import Limits, RewindRequest, ShellRequest, SnapshotRequest
from durable_sandbox.sessions.rates import CallerRates
from durable_sandbox.stores.sqlite import SqliteStore
from durable_sandbox.testing import FakeClock
from tests.unit.sessions_support import NAMESPACE, FakeAuth, effects, local_gate, service


def test_a_bucket_per_caller_refills_at_its_rate() -> None:
    clock = FakeClock(start=100.0)
    rates = CallerRates(2.0, clock=clock)
    assert [rates.take("alice") for _ in range(2)] == [None, None]
    wait = rates.take("alice")
    assert wait == pytest.approx(0.5)
    assert rates.take("bob") is None  # another caller has its own bucket
    clock.now += 0.5
    assert rates.take("alice") is None and rates.take("alice") is not None


async def test_a_caller_over_its_rate_is_refused_with_429_and_nothing_runs(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    auth = FakeAuth()
    auth.rights["bob"] = {(NAMESPACE, "box")}
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"), auth,
                  limits=Limits(max_calls_per_second=1))
    svc.rates = CallerRates(1, clock=FakeClock(start=100.0))  # time stands still: the second call within the second is over
    await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c1", command=f"echo 1 >> {log}"))
    with pytest.raises(CallRefused) as refused:
        await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c2", command=f"echo 2 >> {log}"))
    body = refused.value.body
    assert (body.status, body.reason, body.retry) == (429, "TooManyRequests", True)
    assert "alice made more than 1 calls per second" in body.what and "--session-max-calls-per-second" in body.do
    assert body.retryAfter == pytest.approx(1.0)
    await svc.call("other-token", NAMESPACE, "box", ShellRequest(operationId="c3", command=f"echo 3 >> {log}"))
    assert effects(log) == ["1", "3"]


async def test_the_refusal_over_http_has_retry_after(tmp_path: Path) -> None:
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"))
    svc.rates = CallerRates(1, clock=FakeClock(start=100.0))
    url = "http://sessions/v1/namespaces/demo/sandboxes/box/shell"
    auth = {"Authorization": "Bearer good-token"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(svc)), base_url="http://sessions") as http:
        assert (await http.post(url, headers=auth, json={"operationId": "c1", "command": "true"})).status_code == 200
        over = await http.post(url, headers=auth, json={"operationId": "c2", "command": "true"})
    assert over.status_code == 429 and over.headers["retry-after"] == "1"
    assert math.isclose(over.json()["error"]["retryAfter"], 1.0)


def test_the_client_waits_as_told_then_sends_the_same_call_again() -> None:
    refused = httpx.Response(429, headers={"Retry-After": "2"}, json={"error": {
        "status": 429, "reason": "TooManyRequests", "what": "over", "where": "Sandbox demo/box", "do": "slow down",
        "retry": True, "retryAfter": 0.05}})
    assert _retry_after(refused, 0, started=0.0, retry_for=1e9) == pytest.approx(0.05)
    header_only = httpx.Response(429, headers={"Retry-After": "2"}, json={"error": {"retry": True}})
    assert _retry_after(header_only, 0, started=0.0, retry_for=1e9) == 2.0
    seen: list[str] = []
    answers = [refused]

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body["operationId"])
        if answers:
            return answers.pop(0)
        return httpx.Response(200, json={"operationId": body["operationId"], "exitCode": 0, "stdout": "ok\n"})

    with SandboxClient.attach("box", namespace="demo", url="http://sessions.test", token="t",
                              transport=httpx.MockTransport(handle)) as box:
        assert box.run("true", operation_id="r1").stdout == "ok\n"
    assert seen == ["r1", "r1"]


async def test_a_rewind_and_a_snapshot_take_from_the_same_bucket_as_calls(tmp_path: Path) -> None:
    """A rewind (its replays run calls) and a snapshot cost like a call: over the rate they are refused before
    anything is journaled."""
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"),
                  limits=Limits(max_calls_per_second=1))
    svc.rates = CallerRates(1, clock=FakeClock(start=100.0))
    await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c1", command="true"))
    with pytest.raises(CallRefused) as refused:
        await svc.rewind("good-token", NAMESPACE, "box", RewindRequest(toCall=0))
    assert (refused.value.status, refused.value.body.retryAfter) == (429, pytest.approx(1.0))
    with pytest.raises(CallRefused) as refused:
        await svc.snapshot("good-token", NAMESPACE, "box", SnapshotRequest(operationId="s1"))
    assert refused.value.status == 429
    rows = await svc.journal_for(NAMESPACE).store.load_journal(calls_run_id("uid-1"))
    assert not [r for r in rows if rewind_of(r) is not None or "s1" in r.op_id], "no rewind nor snapshot recorded"
