"""The Sandbox controller's side of durable session calls (issue 35 item 1): after a loss it restores the newest
snapshot, its own (a suspend's) or the session's (``spec.snapshotEveryNCalls``), whichever was taken last; the
record's lineage stays bounded; a session call's loss report wakes the controller to check the sandbox at once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from durable_sandbox.engine.records import Commit, OperationRecord, OpKind, RunRecord, RunStatus
from durable_sandbox.kube.journal.sandbox_records import LINEAGE, SNAPSHOT_AT
from durable_sandbox.kube.sandbox import SandboxController
from durable_sandbox.kube.sandbox.checkpoints import LINEAGE_KEPT, with_lineage
from durable_sandbox.kube.sandbox.view import CALLS_SESSION, SandboxView, calls_run_id
from durable_sandbox.stores.sqlite import SqliteStore

UID = "uid-1"


def controller(store: SqliteStore) -> SandboxController:
    ctl = SandboxController.__new__(SandboxController)  # only what _newest_snapshot reads
    ctl.journals = SimpleNamespace(store_for=lambda _ns: store)  # type: ignore[assignment]
    return ctl


def view(status: dict[str, object]) -> SandboxView:
    body = {"metadata": {"namespace": "demo", "name": "box", "uid": UID}}
    return SandboxView(namespace="demo", name="box", uid=UID, body=body, status=dict(status))


async def session_snapshot(store: SqliteStore, snapshot_id: str, count: int, at: float) -> None:
    run_id = calls_run_id(UID)
    if await store.get_run(run_id) is None:
        await store.create_run(RunRecord(run_id=run_id, workflow="sandbox-session", status=RunStatus.RUNNING, input={}))
    lease = await store.claim(run_id, "w", 10.0)
    op = f"{CALLS_SESSION}/snapshot/{count}"
    await store.commit(run_id, lease.fence, Commit(records=[OperationRecord(
        op, OpKind.SANDBOX_SNAPSHOT.value, "snapshot", "completed", result={"snapshotId": snapshot_id},
        meta={"count": count}, ts=at)]))
    await store.release(lease)


async def test_the_newest_snapshot_is_the_one_taken_last_whoever_took_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    ctl = controller(store)
    assert await ctl._newest_snapshot(view({})) is None
    assert await ctl._newest_snapshot(view({"snapshots": ["own-1"], SNAPSHOT_AT: 100.0})) == "own-1"
    await session_snapshot(store, "calls-6", 6, at=200.0)
    assert await ctl._newest_snapshot(view({})) == "calls-6"
    assert await ctl._newest_snapshot(view({"snapshots": ["own-1"], SNAPSHOT_AT: 100.0})) == "calls-6"
    assert await ctl._newest_snapshot(view({"snapshots": ["own-2"], SNAPSHOT_AT: 300.0})) == "own-2"


def test_the_lineage_keeps_the_newest_entries() -> None:
    lineage: dict[str, str] = {}
    for i in range(LINEAGE_KEPT + 5):
        lineage = with_lineage(lineage, f"sbx-{i}", f"snap-{i}")
    assert len(lineage) == LINEAGE_KEPT and "sbx-0" not in lineage and lineage[f"sbx-{LINEAGE_KEPT + 4}"] == f"snap-{LINEAGE_KEPT + 4}"
    assert list(with_lineage(lineage, "sbx-10", "again"))[-1] == "sbx-10"  # re-written: newest again


def test_a_loss_report_wakes_the_controller_to_check_the_sandbox_once() -> None:
    v = view({})
    v.notice({"metadata": v.body["metadata"], "status": {"lossReported": "sbx-1"}})
    assert v.check_live and v.wake.is_set()
    v.check_live = False
    v.wake.clear()
    v.notice({"metadata": v.body["metadata"], "status": {"lossReported": "sbx-1"}})  # the same report: nothing new
    assert not v.check_live and not v.wake.is_set()


async def test_after_a_rewind_its_own_snapshot_taken_before_it_is_never_restored(tmp_path: Path) -> None:
    """A suspend's snapshot taken before the session was rewound holds rewound calls (sessions/rewind.py): the
    newest snapshot is then the session's at or before the rewind's point, or none (a fresh sandbox)."""
    store = SqliteStore(tmp_path / "runs.db")
    ctl = controller(store)
    await session_snapshot(store, "calls-2", 2, at=100.0)
    suspended = view({"snapshots": ["own-1"], SNAPSHOT_AT: 200.0})
    assert await ctl._newest_snapshot(suspended) == "own-1"
    lease = await store.claim(calls_run_id(UID), "w", 10.0)
    await store.commit(calls_run_id(UID), lease.fence, Commit(records=[OperationRecord(
        f"{CALLS_SESSION}/rewind/1", OpKind.SANDBOX_RESTORE.value, "rewind", "completed",
        meta={"toCall": 3, "rewound": [f"{CALLS_SESSION}/c3"]}, ts=300.0)]))
    await store.release(lease)
    assert await ctl._newest_snapshot(suspended) == "calls-2"
    assert await ctl._newest_snapshot(view({"snapshots": ["own-2"], SNAPSHOT_AT: 400.0})) == "own-2"  # taken after
    # ... unless it was taken of a sandbox holding rewound calls (suspended before the rewind replaced it).
    lease = await store.claim(calls_run_id(UID), "w", 10.0)
    await store.commit(calls_run_id(UID), lease.fence, Commit(records=[OperationRecord(
        f"{CALLS_SESSION}/c4", OpKind.SANDBOX_CALL.value, "shell", "completed", result={"exitCode": 0},
        meta={"index": 4, "operationId": "c4", "sandboxId": "sbx-old"}, ts=250.0)]))
    await store.release(lease)
    lease = await store.claim(calls_run_id(UID), "w", 10.0)
    await store.commit(calls_run_id(UID), lease.fence, Commit(records=[OperationRecord(
        f"{CALLS_SESSION}/rewind/2", OpKind.SANDBOX_RESTORE.value, "rewind", "completed",
        meta={"toCall": 3, "rewound": [f"{CALLS_SESSION}/c4"]}, ts=300.0)]))
    await store.release(lease)
    stale = view({"snapshots": ["own-3"], SNAPSHOT_AT: 400.0, LINEAGE: {"own-3": "sbx-old"}})
    assert await ctl._newest_snapshot(stale) == "calls-2"
