"""Issue 35: a snapshot asked for (``POST .../snapshot``, the client's ``snapshot()``) is taken now, once the live
sandbox holds every completed session call, journaled like the snapshots every ``spec.snapshotEveryNCalls`` calls
(a loss restores it; the one it supersedes is deleted only after it is recorded); the same operation id again
answers with the snapshot it took."""

from __future__ import annotations

from pathlib import Path

import httpx

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.sessions.http import create_app
from durable_sandbox.sessions.journal import calls_run_id
from durable_sandbox.sessions.models import ShellRequest, SnapshotRequest
from durable_sandbox.sessions.rebuild import REBUILD
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, FakeGate, local_gate, service

URL = "http://sessions/v1/namespaces/demo/sandboxes/box"


async def setup(tmp_path: Path, every: int = 0) -> tuple[FakeGate, SqliteStore, SessionService]:
    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    gate.store, gate.snapshot_every = store, every
    return gate, store, service(store, gate)


async def shell(svc: SessionService, op: str, command: str) -> str:
    return (await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId=op, command=command))).stdout


async def snapshot_rows(store: SqliteStore) -> list[OperationRecord]:
    return [r for r in await store.load_journal(calls_run_id("uid-1")) if r.kind == "sandbox.snapshot"]


async def test_a_snapshot_asked_for_is_journaled_and_a_loss_restores_it_with_nothing_to_replay(tmp_path: Path) -> None:
    gate, store, svc = await setup(tmp_path)
    for i in range(3):
        await shell(svc, f"c{i}", f"echo {i} >> f")
    taken = await svc.snapshot("good-token", NAMESPACE, "box", SnapshotRequest(operationId="snap-1"))
    assert (taken.calls, taken.replayed) == (3, False)
    assert gate.provider._snapshot_path(taken.snapshotId).exists()
    [recorded] = [r for r in await snapshot_rows(store) if r.status == "completed"]
    assert recorded.result["snapshotId"] == taken.snapshotId and (recorded.meta or {})["request"] == "snap-1"

    again = await svc.snapshot("good-token", NAMESPACE, "box", SnapshotRequest(operationId="snap-1"))
    assert (again.snapshotId, again.calls, again.replayed) == (taken.snapshotId, 3, True)
    assert len([r for r in await snapshot_rows(store) if r.status == "completed"]) == 1  # none taken again

    lost = gate.handle
    await gate.provider.inject_loss(lost)
    assert await shell(svc, "c3", "cat f") == "0\n1\n2\n"
    assert gate.replacements == [(lost.id, taken.snapshotId)]
    rebuilt = [r for r in await store.load_journal(calls_run_id("uid-1"))
               if r.op_id == f"{REBUILD}/{gate.handle.id}" and r.status == "completed"]
    assert [((r.meta or {})["from"], r.result["replayed"]) for r in rebuilt] == [(3, [])]  # the snapshot held every call


async def test_a_snapshot_asked_for_supersedes_the_every_n_one_deleted_after_it_is_recorded(tmp_path: Path) -> None:
    gate, store, svc = await setup(tmp_path, every=2)
    for i in range(3):
        await shell(svc, f"c{i}", f"echo {i} >> f")  # the session's snapshot after c1 (2 calls)
    taken = await svc.snapshot("good-token", NAMESPACE, "box", SnapshotRequest(operationId="snap-1"))
    rows = [(r.op_id, r.status, (r.result or {}).get("snapshotId"))
            for r in await store.load_journal(calls_run_id("uid-1")) if "snapshot" in r.kind]
    every_two = next(str(sid) for op, status, sid in rows if status == "completed" and sid != taken.snapshotId)
    asked_recorded = rows.index(next(row for row in rows if row[2] == taken.snapshotId))
    first_deleted = next(i for i, (op, status, _) in enumerate(rows) if "delete" in op)
    assert taken.calls == 3 and asked_recorded < first_deleted
    assert not gate.provider._snapshot_path(every_two).exists()
    assert gate.provider._snapshot_path(taken.snapshotId).exists()


async def test_the_snapshot_endpoint_authorizes_first_and_answers_json(tmp_path: Path) -> None:
    _, store, svc = await setup(tmp_path)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(svc)), base_url="http://sessions") as http:
        refused = await http.post(f"{URL}/snapshot", json={"operationId": "s1"})
        forbidden = await http.post(f"{URL}/snapshot", json={"operationId": "s1"},
                                    headers={"Authorization": "Bearer other-token"})
        bad = await http.post(f"{URL}/snapshot", json={"operationId": "s1", "extra": 1},
                              headers={"Authorization": "Bearer good-token"})
        assert not await snapshot_rows(store)  # nothing taken for a refused caller
        answer = await http.post(f"{URL}/snapshot", json={"operationId": "s1"},
                                 headers={"Authorization": "Bearer good-token"})
    assert (refused.status_code, forbidden.status_code, bad.status_code) == (401, 403, 400)
    assert "snapshot" in bad.json()["error"]["where"]
    assert answer.status_code == 200 and answer.json()["calls"] == 0 and answer.json()["snapshotId"]
