"""Cleanup that the provider refuses: retried with backoff, never dropped silently. A refusal that
outlasts the retries fails the run with CleanupFailed while the journal still lists the snapshot as
live, so `resume` finishes the cleanup once the provider accepts again."""

from __future__ import annotations

from pathlib import Path

import pytest

import durable_sandbox as ds
import durable_sandbox.sandboxes.retries as session_retries
from durable_sandbox.providers.contract import ProviderError
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes.services import SandboxServices
from durable_sandbox.stores import SqliteStore


class RefusingProvider(LocalProvider):
    """The local provider, refusing the next ``refusals`` snapshot deletions with a transient error."""

    def __init__(self, home: Path, refusals: int) -> None:
        super().__init__(home)
        self.refusals = refusals
        self.delete_attempts = 0

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.delete_attempts += 1
        if self.refusals > 0:
            self.refusals -= 1
            raise ProviderError(f"snapshot {snapshot_id} is busy; try again")
        await super().delete_snapshot(snapshot_id)


SPEC = {
    "toolCalls": [{"type": "shell", "command": f"echo {i} >> log.txt"} for i in range(2)],
    "snapshotEveryNCalls": 2,
}


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_retries, "FIRST_RETRY_DELAY", 0.0)
    monkeypatch.setattr(session_retries, "MAX_RETRY_DELAY", 0.0)


async def test_transient_refusals_are_retried_until_the_snapshot_is_deleted(tmp_path: Path) -> None:
    provider = RefusingProvider(tmp_path / "home", refusals=session_retries.CLEANUP_ATTEMPTS - 1)
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    state = await engine.run("sandbox-agent", SPEC, run_id="c1")
    assert state.status == "succeeded", state.error
    assert provider.delete_attempts == session_retries.CLEANUP_ATTEMPTS
    assert provider.leftovers() == []
    await engine.aclose()


async def test_a_persistent_refusal_fails_the_run_and_resume_finishes_the_cleanup(tmp_path: Path) -> None:
    provider = RefusingProvider(tmp_path / "home", refusals=10**6)
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    state = await engine.run("sandbox-agent", SPEC, run_id="c2")
    assert state.status == "failed"
    assert state.error is not None and state.error["type"] == "CleanupFailed"
    assert "after 8 attempts" in state.error["message"] and "is busy" in state.error["message"]
    assert len(state.snapshots) == 1, "the journal still lists the snapshot it could not delete"
    assert provider.list_snapshots() == state.snapshots

    provider.refusals = 0  # the provider accepts again
    state = await engine.resume("c2")
    assert state.status == "succeeded", state.error
    assert state.snapshots == []
    assert provider.leftovers() == [], "nothing was dropped: the retry deleted what the first attempt could not"
    await engine.aclose()

    # The operator's --cleanup-attempts (SandboxServices.cleanup_attempts) bounds the tries instead.
    provider.refusals, provider.delete_attempts = 10**6, 0
    engine = ds.Engine(SqliteStore(tmp_path / "runs3.db"), providers={"local": provider},
                       extensions=[SandboxServices(cleanup_attempts=3)])
    state = await engine.run("sandbox-agent", SPEC, run_id="c3")
    assert state.status == "failed" and state.error is not None
    assert "after 3 attempts" in state.error["message"] and provider.delete_attempts == 3
    await engine.aclose()


class FlakyDuringReplay(LocalProvider):
    """Loses the sandbox after the 2nd call, then answers the first replayed call with a transient error."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.executed = 0
        self.flaked = False

    async def execute(self, handle, call):  # type: ignore[no-untyped-def]
        self.executed += 1
        if self.executed == 3 and not self.flaked:  # the replay of call 1 into the replacement
            self.flaked = True
            raise ProviderError("503 from the sandbox host; try again")
        return await super().execute(handle, call)


async def test_a_transient_error_while_replaying_into_a_replacement_is_retried(tmp_path: Path) -> None:
    provider = FlakyDuringReplay(tmp_path / "home")
    engine = ds.Engine(SqliteStore(tmp_path / "runs.db"), providers={"local": provider})
    spec = {
        "toolCalls": [{"type": "shell", "command": f"echo {i} >> log.txt; cat log.txt"} for i in range(3)],
        "injectLossAfterNCalls": 2,
    }
    state = await engine.run("sandbox-agent", spec, run_id="flaky-replay")
    assert state.status == "succeeded", state.error
    assert provider.flaked, "the transient error happened during the replay"
    assert state.recovery_count == 1
    assert state.result["toolResults"][2]["stdout"] == "0\n1\n2\n", "the replacement was rebuilt faithfully"
    assert provider.leftovers() == []
    await engine.aclose()
