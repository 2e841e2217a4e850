"""Sandbox sessions (DESIGN section 6) with the e2b provider against the fake E2B server.

Losses here are real to the adapter: the fake's kill switch removes the sandbox out of band (every later
request about it answers 404), at a deterministic point chosen through a provider wrapper or the
provider's backoff hook, never by loss injection (e2b does not offer it). After every test the fake holds
no sandbox and no snapshot (a test handed a retained snapshot deletes it first).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.providers.contract import SandboxHandle, SandboxSpec, ToolCall, ToolResult
from durable_sandbox.providers.e2b import snapshot_name
from tests.contract.e2b_support import RecordingSleep, make_provider
from tests.fakes.e2b_state import FakeState
from tests.unit.sandbox_session_support import SESSION_CALLS as CALLS
from tests.unit.sandbox_session_support import Hooked, derived_id, engine_for, journal_index

AGENT = "sandbox-agent"



class KillingSleep(RecordingSleep):
    """The provider's backoff sleep; when armed, the fake kills the sandbox while the provider waits to retry."""

    def __init__(self, fake: FakeState) -> None:
        super().__init__()
        self.fake = fake
        self.victim: str | None = None

    async def __call__(self, seconds: float) -> None:
        await super().__call__(seconds)
        if self.victim is not None:
            self.fake.kill(self.victim)
            self.victim = None


@pytest.fixture
def sleep(fake_e2b: FakeState) -> KillingSleep:
    return KillingSleep(fake_e2b)


@pytest.fixture
async def e2b(fake_e2b: FakeState, sleep: KillingSleep) -> AsyncIterator[Hooked]:
    provider = Hooked(make_provider(fake_e2b, sleep=sleep), list_snapshots=lambda: [s.id for s in fake_e2b.snapshots()])
    yield provider
    await provider.aclose()
    assert fake_e2b.live_sandboxes() == [], "the run left sandboxes behind"
    assert fake_e2b.snapshots() == [], "the run left snapshots behind"


@pytest.fixture
async def engine(tmp_path: Path, e2b: Hooked) -> AsyncIterator[durable_sandbox.Engine]:
    e = engine_for(tmp_path / "runs.db", {"e2b": e2b})
    yield e
    await e.aclose()


def spec(calls: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return {"toolCalls": calls, "sandbox": {"provider": "e2b", "leaseSeconds": 600}, **options}


def outcomes(state: durable_sandbox.RunState) -> list[tuple[int, str, str]]:
    return [(r["exitCode"], r["stdout"], r["stderr"]) for r in state.result["toolResults"]]


def completed(rows: list[OperationRecord], kind: str) -> list[OperationRecord]:
    return [r for r in rows if r.kind == kind and r.status == "completed"]


def kill_after_executes(e2b: Hooked, fake: FakeState, n: int) -> None:
    """Kill the sandbox from the fake's side right after the n-th command the provider executed."""
    async def hook(handle: SandboxHandle, call: ToolCall, result: ToolResult) -> None:
        if e2b.executes == n:
            fake.kill(handle.id)

    e2b.after_execute = hook


async def baseline(engine: durable_sandbox.Engine, calls: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    state = await engine.run(AGENT, spec(calls), run_id="baseline")
    assert state.status == "succeeded", state.error
    return outcomes(state)


async def test_snapshot_rotation(engine: durable_sandbox.Engine, e2b: Hooked, fake_e2b: FakeState) -> None:
    calls = [{"type": "shell", "command": f"echo {i} >> log.txt"} for i in range(7)]
    state = await engine.run(AGENT, spec(calls, snapshotEveryNCalls=2), run_id="rot")
    assert state.status == "succeeded", state.error
    rows = await engine.history("rot")
    taken = completed(rows, "sandbox.snapshot")
    assert [r.op_id for r in taken] == ["sandbox/snapshot/2", "sandbox/snapshot/4", "sandbox/snapshot/6"]
    ids = [r.result["snapshotId"] for r in taken]
    for old, new in [("sandbox/snapshot/2", "sandbox/snapshot/4"), ("sandbox/snapshot/4", "sandbox/snapshot/6")]:
        assert journal_index(rows, new, "completed") < journal_index(rows, f"{old}/delete", "started")
    assert max(e2b.population) == 2, "E2B never held more than the current and the superseded snapshot"
    assert fake_e2b.deleted_templates == ids, "deleted oldest first; the last one at finalization"
    names = [r.meta["operationId"] for r in taken]
    assert [r.json["name"] for r in fake_e2b.calls("POST", "/sandboxes/") if r.path.endswith("/snapshots")] == [
        snapshot_name(n) for n in names]


async def test_recovery_after_an_out_of_band_kill_replays_a_nonzero_exit(engine: durable_sandbox.Engine,
                                                                         e2b: Hooked, fake_e2b: FakeState) -> None:
    expected = await baseline(engine, CALLS)
    assert expected[2][0] == 2
    kill_after_executes(e2b, fake_e2b, len(CALLS) + 3)  # right after call 2 (nonzero exit) of the second run
    state = await engine.run(AGENT, spec(CALLS, snapshotEveryNCalls=2), run_id="killed")
    assert state.status == "succeeded", state.error
    assert outcomes(state) == expected
    assert state.result["recoveryCount"] == 1 == state.recovery_count
    rows = await engine.history("killed")
    [restore] = completed(rows, "sandbox.restore")
    snap2 = completed(rows, "sandbox.snapshot")[0].result["snapshotId"]
    assert restore.meta["snapshotId"] == snap2 and restore.meta["reason"] == "recovery"
    assert restore.meta["replayed"] == [f"sandbox/{derived_id('killed', 2)}"]
    # The replacement was created from the snapshot, and the interrupted call 3 ran on it with its op id.
    creates = [r.json["templateID"] for r in fake_e2b.calls("POST", "/v2/sandboxes") if r.path == "/v2/sandboxes"]
    assert creates[-1] == snap2
    run_calls = e2b.calls("execute")[len(CALLS):]
    assert run_calls == [derived_id("killed", i) for i in (0, 1, 2, 3, 2, 3, 4, 5)]
    assert [r.meta["reason"] for r in completed(rows, "sandbox.destroy") if r.meta.get("reason")] == ["lost", "finalize"]


async def test_loss_during_rotation_with_a_lost_snapshot_response_takes_no_duplicate(
        engine: durable_sandbox.Engine, e2b: Hooked, fake_e2b: FakeState, sleep: KillingSleep) -> None:
    expected = await baseline(engine, CALLS)
    snapshots_before = len(e2b.calls("snapshot"))

    async def second_snapshot_loses_its_response_and_its_sandbox(handle: SandboxHandle, operation_id: str) -> None:
        if len(e2b.calls("snapshot")) == snapshots_before + 1:
            fake_e2b.drop_connection_after_snapshot()  # E2B persists it, the answer never arrives ...
            sleep.victim = handle.id  # ... and the sandbox dies while the provider backs off

    e2b.before_snapshot = second_snapshot_loses_its_response_and_its_sandbox
    state = await engine.run(AGENT, spec(CALLS, snapshotEveryNCalls=2), run_id="lost-rotation")
    assert state.status == "succeeded", state.error
    assert outcomes(state) == expected
    rows = await engine.history("lost-rotation")
    taken = completed(rows, "sandbox.snapshot")
    assert [r.op_id for r in taken] == ["sandbox/snapshot/2", "sandbox/snapshot/4", "sandbox/snapshot/6"]
    name4 = snapshot_name(taken[1].meta["operationId"])
    posts = [r for r in fake_e2b.calls("POST", "/sandboxes/") if r.path.endswith("/snapshots")]
    assert [r.json["name"] for r in posts].count(name4) == 1, "the retry found the persisted snapshot"
    assert taken[1].result["snapshotId"] == f"fake-team/{name4}:default"
    # The loss is noticed by the next call; recovery restores the snapshot taken at 4, with nothing to replay.
    [restore] = completed(rows, "sandbox.restore")
    assert restore.meta["snapshotId"] == taken[1].result["snapshotId"] and restore.meta["replayed"] == []
    assert state.recovery_count == 1
    assert max(e2b.population) <= 2
    assert sleep.victim is None and len(sleep.delays) == 1, "the kill happened during the provider's one retry"


async def test_loss_reported_by_the_snapshot_restores_the_checkpoint_and_retries_the_same_name(
        engine: durable_sandbox.Engine, e2b: Hooked, fake_e2b: FakeState) -> None:
    expected = await baseline(engine, CALLS)
    seen: list[str] = []

    async def kill_before_the_second_snapshot(handle: SandboxHandle, operation_id: str) -> None:
        seen.append(operation_id)
        if len(seen) == 2:
            fake_e2b.kill(handle.id)

    e2b.before_snapshot = kill_before_the_second_snapshot
    state = await engine.run(AGENT, spec(CALLS, snapshotEveryNCalls=2), run_id="snap-gone")
    assert state.status == "succeeded", state.error
    assert outcomes(state) == expected and state.recovery_count == 1
    assert seen[1] == seen[2], "the snapshot is retried with the same operation id"
    rows = await engine.history("snap-gone")
    taken = completed(rows, "sandbox.snapshot")
    [restore] = completed(rows, "sandbox.restore")
    assert restore.meta["snapshotId"] == taken[0].result["snapshotId"]
    assert restore.meta["replayed"] == [f"sandbox/{derived_id('snap-gone', i)}" for i in (2, 3)]
    posts = [r for r in fake_e2b.calls("POST", "/sandboxes/") if r.path.endswith("/snapshots")]
    assert [r.status for r in posts if r.json["name"] == snapshot_name(seen[1])] == [404, 201]


async def test_retained_snapshot_is_handed_over_on_success(engine: durable_sandbox.Engine, e2b: Hooked,
                                                           fake_e2b: FakeState) -> None:
    kill_after_executes(e2b, fake_e2b, 3)  # a recovery on the way does not change what is retained
    state = await engine.run(AGENT, spec(CALLS[:4], snapshotEveryNCalls=2, retainLatestSnapshot=True), run_id="keep")
    assert state.status == "succeeded", state.error
    kept = state.result["latestSnapshot"]
    assert [s.id for s in fake_e2b.snapshots()] == [kept] and fake_e2b.live_sandboxes() == []
    assert kept == completed(await engine.history("keep"), "sandbox.snapshot")[-1].result["snapshotId"]
    provider = e2b.inner
    handle = await provider.restore(kept, SandboxSpec(owner="caller"), lease_seconds=60)
    read = await provider.execute(handle, ToolCall(operation_id="check", type="read_file", args={"path": "a.txt"}))
    assert read.stdout == "hello\nmore\nbroken\n"
    await provider.destroy(handle)
    await provider.delete_snapshot(kept)


async def test_nothing_is_retained_when_the_run_fails(engine: durable_sandbox.Engine, e2b: Hooked,
                                                      fake_e2b: FakeState) -> None:
    state = await engine.run("test-sessions-fails-inside", {"provider": "e2b"}, run_id="keep-failed")
    assert state.status == "failed" and "the agent gave up" in state.error["message"]
    assert len(e2b.calls("snapshot")) == 2 and fake_e2b.deleted_templates == e2b.calls("snapshot")
    assert e2b.calls("destroy") == e2b.calls("provision")


async def test_a_lost_create_answer_and_a_provider_that_gives_up_leave_one_sandbox(
        engine: durable_sandbox.Engine, e2b: Hooked, fake_e2b: FakeState) -> None:
    """E2B answers 503 four times, then creates the sandbox but its answer is lost: the provider's five
    attempts are spent and it gives up, so the session retries the provision. Every create carried the key
    derived from the provision's operation id, so the session's retry is answered with the sandbox E2B made:
    one sandbox for the whole run (the fixture checks it is destroyed at the end)."""
    fake_e2b.fail_create(503, times=4)
    fake_e2b.drop_connection_after_create()
    state = await engine.run(AGENT, spec(CALLS[:2]), run_id="lost-create")
    assert state.status == "succeeded", state.error
    creates = fake_e2b.calls("POST", "/v2/sandboxes")
    assert [r.status for r in creates] == [503] * 4 + [0, 201], "the 5th answer lost; the session's retry got it"
    assert len({r.headers["Idempotency-Key"] for r in creates}) == 1
    assert fake_e2b.seq == 1, "E2B made exactly one sandbox"
    assert len(e2b.calls("provision")) == 1 and e2b.calls("provision") == e2b.calls("destroy")
