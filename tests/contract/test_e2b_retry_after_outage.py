"""A run that failed because E2B was out (a process stream error outlasting every retry) can be retried:
by `dsb resume` (API: Engine.resume) and by the manifest's `spec.retry`. The retry re-opens the sandbox
session into a fresh sandbox, replays the calls completed before the outage (outcomes checked) and gives
the same results as an uninterrupted run; between the failure and the retry nothing is left on E2B.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import durable_sandbox.sandboxes.retries as session_retries
from durable_sandbox.providers.contract import SandboxHandle, ToolCall
from tests.contract.e2b_support import make_provider
from tests.dsb import dsb
from tests.fakes.e2b_state import FakeState
from tests.unit.sandbox_session_support import Hooked, engine_for

ROOT = Path(__file__).resolve().parents[2]
AGENT = "sandbox-agent"
CALLS = [
    {"type": "write_file", "path": "a.txt", "contents": "a\n"},
    {"type": "write_file", "path": "b.txt", "contents": "b\n"},
    {"type": "shell", "command": "cat a.txt b.txt; echo c >> a.txt"},
    {"type": "shell", "command": "wc -l < a.txt"},
]
EXPECTED = [(0, "wrote a.txt 2 bytes", ""), (0, "wrote b.txt 2 bytes", ""), (0, "a\nb\n", ""), (0, "2\n", "")]


def results(result: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(r["exitCode"], r["stdout"], r["stderr"]) for r in result["toolResults"]]


async def test_a_run_failed_by_an_e2b_outage_is_resumed_with_the_same_results(
        fake_e2b: FakeState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_retries, "FIRST_RETRY_DELAY", 0.0)  # the session's own retries, not waited out
    provider = Hooked(make_provider(fake_e2b), list_snapshots=lambda: [s.id for s in fake_e2b.snapshots()])

    async def outage_at_the_first_shell(handle: SandboxHandle, call: ToolCall) -> None:
        if call.type == "shell" and not fake_e2b.stream_faults and not outage_done:
            for _ in range(session_retries.TRANSIENT_ATTEMPTS):  # more than the session retries
                fake_e2b.end_stream_with_error("unavailable", "envd is down")
            outage_done.append(True)

    outage_done: list[bool] = []
    provider.before_execute = outage_at_the_first_shell
    engine = engine_for(tmp_path / "runs.db", {"e2b": provider})
    try:
        failed = await engine.run(AGENT, {"toolCalls": CALLS, "sandbox": {"provider": "e2b"}}, run_id="outage")
        assert failed.status == "failed", failed
        assert "envd is down" in str(failed.error)
        assert fake_e2b.live_sandboxes() == [] and fake_e2b.snapshots() == [], "nothing left while failed"
        state = await engine.resume("outage")
    finally:
        await engine.aclose()
    assert state.status == "succeeded", state.error
    assert results(state.result) == EXPECTED
    assert fake_e2b.live_sandboxes() == [] and fake_e2b.snapshots() == []


async def test_spec_retry_retries_a_run_failed_by_an_e2b_outage(fake_e2b: FakeState, tmp_path: Path) -> None:
    manifest = tmp_path / "retry.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": "retry"},
        "spec": {"sandbox": {"provider": "e2b"}, "toolCalls": CALLS,
                 "retry": {"maxAttempts": 2, "initialIntervalSeconds": 0}},
    }))
    # The first shell call meets an outage that outlasts the session's retries; then E2B is back.
    for _ in range(session_retries.TRANSIENT_ATTEMPTS):
        fake_e2b.end_stream_with_error("unavailable", "envd is down")
    env = {"E2B_API_KEY": fake_e2b.api_key, "E2B_API_URL": fake_e2b.api_url, "E2B_SANDBOX_URL": fake_e2b.sandbox_url}
    # In a thread: the fake E2B server this test runs answers on this event loop.
    proc = await asyncio.to_thread(dsb, "-o", "json", "run", str(manifest), home=tmp_path / "home",
                                   store=tmp_path / "runs.db", env=env, process=True)
    assert proc.returncode == 0, proc.stderr
    assert "retrying (attempt 2/2)" in proc.stderr
    state = json.loads(proc.stdout)
    assert state["status"] == "succeeded" and results(state["result"]) == EXPECTED
    assert fake_e2b.live_sandboxes() == [] and fake_e2b.snapshots() == []
