"""A rewind with the snapshot endpoint and streamed calls (sessions/rewind.py with sessions/snapshots.py and
sessions/streaming.py): a snapshot taken on request that holds rewound calls is deleted by the rewind like an
every-N one, never restored (not by the rewind's rebuild, not after a later loss), and its operation id is refused
after; a snapshot asked for after the rewind holds the calls kept and those since; a streamed call after a rewind
to N goes at N (the session's call N+1) and streams its output."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sandbox.providers.streaming import Stream
from durable_sandbox.sandboxes.holdings import holdings
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from durable_sandbox.sessions.models import RewindRequest, ShellRequest, SnapshotRequest
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, FakeGate, local_gate, service


async def setup(tmp_path: Path) -> tuple[FakeGate, SqliteStore, SessionService]:
    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    gate.store = store
    return gate, store, service(store, gate)


async def line(svc: SessionService, op: str) -> None:
    await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId=op, command=f"echo {op} >> notes.txt"))


def notes(gate: FakeGate) -> list[str]:
    path = Path(gate.handle.metadata["workspace"]) / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


async def test_a_snapshot_asked_for_that_holds_rewound_calls_is_never_restored_nor_answered(tmp_path: Path) -> None:
    gate, store, svc = await setup(tmp_path)
    for op in ("c0", "c1", "c2"):
        await line(svc, op)
    asked = await svc.snapshot("good-token", NAMESPACE, "box", SnapshotRequest(operationId="snap-3"))
    assert asked.calls == 3 and gate.provider._snapshot_path(asked.snapshotId).exists()

    stale = gate.handle
    done = await svc.rewind("good-token", NAMESPACE, "box", RewindRequest(toCall=1))
    assert done.rewound == ["c1", "c2"] and done.replayed == ["c0"]
    assert gate.replacements == [(stale.id, None)]  # rebuilt fresh: the snapshot after 3 calls is not restored
    assert not gate.provider._snapshot_path(asked.snapshotId).exists()  # deleted like an every-N one
    journal = await store.load_journal(calls_run_id("uid-1"))
    assert asked.snapshotId in holdings(journal, SESSION).stale
    assert notes(gate) == ["c0"]

    with pytest.raises(CallRefused) as refused:  # never answered with a snapshot that is gone
        await svc.snapshot("good-token", NAMESPACE, "box", SnapshotRequest(operationId="snap-3"))
    assert refused.value.status == 409 and "rewound" in refused.value.body.what

    await line(svc, "n1")
    after = await svc.snapshot("good-token", NAMESPACE, "box", SnapshotRequest(operationId="snap-after"))
    assert after.calls == 2 and after.snapshotId != asked.snapshotId  # c0 kept, n1 since
    lost = gate.handle
    await gate.provider.inject_loss(lost)
    await line(svc, "n2")
    assert gate.replacements[-1] == (lost.id, after.snapshotId)  # a later loss restores the one taken after
    assert notes(gate) == ["c0", "n1", "n2"]


async def test_a_streamed_call_after_a_rewind_continues_at_n_plus_one(tmp_path: Path) -> None:
    _, store, svc = await setup(tmp_path)
    for op in ("c0", "c1", "c2", "c3"):
        await line(svc, op)
    await svc.rewind("good-token", NAMESPACE, "box", RewindRequest(toCall=2))
    streamed: list[tuple[Stream, bytes]] = []
    answer = await svc.call("good-token", NAMESPACE, "box",
                            ShellRequest(operationId="s2", command="echo s2 >> notes.txt; cat notes.txt"),
                            sink=lambda stream, data: streamed.append((stream, data)))
    assert answer.stdout == "c0\nc1\ns2\n" and not answer.replayed
    assert b"".join(data for stream, data in streamed if stream == "stdout").decode() == answer.stdout
    state = SessionState.derive(SESSION, await store.load_journal(calls_run_id("uid-1")))
    assert [state.calls[i][0] for i in sorted(state.calls)] == ["calls/c0", "calls/c1", "calls/s2"]  # at index 2
    assert state.next_index == 3
