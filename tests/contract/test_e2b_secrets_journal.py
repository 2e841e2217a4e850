"""Issue 3, acceptance 4 (the engine side): with a recognizable E2B_API_KEY and a secret sandbox env
value, neither reaches the journal, the run state, the events, `dsb inspect` output or any log line.
The provider-level half (logs, exceptions, handles) is in test_e2b_secrets.py."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

import durable_sandbox as ds
from durable_sandbox.providers.e2b import E2BProvider
from durable_sandbox.stores import SqliteStore
from tests.dsb import dsb
from tests.fakes.e2b_state import FakeState

SENTINEL_KEY = "e2b_SENTINEL_journal_7d1e4f9c2a"
SECRET_ENV = "env-SENTINEL-value-0b5e"


async def test_no_secret_in_journal_state_events_or_inspect(
    fake_e2b: FakeState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(tmp_path))
    monkeypatch.setenv("E2B_API_KEY", SENTINEL_KEY)
    monkeypatch.setenv("E2B_API_URL", fake_e2b.api_url)
    monkeypatch.setenv("E2B_SANDBOX_URL", fake_e2b.sandbox_url)
    fake_e2b.api_key = SENTINEL_KEY
    caplog.set_level(logging.DEBUG)

    db = tmp_path / "runs.db"
    engine = ds.Engine(SqliteStore(db), providers={"e2b": E2BProvider()})
    spec = {
        "toolCalls": [
            {"type": "shell", "command": "test -n \"$TOKEN\" && echo token-present"},
            {"type": "write_file", "path": "a.txt", "contents": "x"},
            {"type": "read_file", "path": "a.txt"},
        ],
        "sandbox": {"provider": "e2b", "env": [{"name": "TOKEN", "value": SECRET_ENV}]},
        "snapshotEveryNCalls": 2,
    }
    state = await engine.run("sandbox-agent", spec, run_id="secret-run")
    assert state.status == "succeeded", state.error
    assert state.result["toolResults"][0]["stdout"] == "token-present\n"  # the env did reach the sandbox
    history = await engine.history("secret-run")
    events = [e async for e in engine.stream("secret-run", follow=False)]
    await engine.aclose()

    # The manifest's literal env value is part of the run's input (as in a Kubernetes spec); what must
    # never be stored is what the engine adds: the API key, and env values in sandbox records.
    texts = {
        "journal": json.dumps([r.to_json() for r in history]),
        "events": json.dumps(events),
        "logs": caplog.text,
        "state.operations": json.dumps([o.model_dump(mode="json") for o in state.operations]),
        "state.result": json.dumps(state.result),
    }
    for where, text in texts.items():
        assert SENTINEL_KEY not in text, f"API key leaked into {where}"
        assert SECRET_ENV not in text, f"sandbox env value leaked into {where}"
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("runs.db*"))  # noqa: ASYNC240 - a test reading its own files
    assert SENTINEL_KEY.encode() not in raw, "API key leaked into the store file"

    for output in ("json", "table"):
        # In a thread: the fake E2B server this test runs answers on this event loop.
        proc = await asyncio.to_thread(dsb, "-o", output, "inspect", "secret-run", store=db, process=True)
        assert proc.returncode == 0, proc.stderr
        assert "secret-run" in proc.stdout
        assert SENTINEL_KEY not in proc.stdout + proc.stderr
