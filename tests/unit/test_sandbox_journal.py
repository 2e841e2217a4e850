"""sandboxes/journal.py is the one owner of the sandbox sessions' journal schema: the op id forms, the meta
keys and what each record means. The session writes by it and every reader reads by it: nothing else in the
package decodes a session's records (checked over the source), and the engine imports nothing of sandboxes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durable_sandbox import Engine
from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.sandboxes import journal
from durable_sandbox.stores import SqliteStore

PACKAGE = Path(journal.__file__).resolve().parents[1]

# What decoding a session's record by hand looks like: its meta keys read, its op ids taken apart.
DECODING = re.compile(
    r"""meta\b.*\.get\(["'](?:reason|finalized|retained|replayed|snapshotId|sandboxId|index|count|detached)["']"""
    r"""|["']/(?:provision|finalize|restore|destroy|inject_loss|snapshot)["'/]"""
)
WRITERS_AND_OWNER = {"sandboxes/journal.py", "sandboxes/session.py"}
# Documents of their own, not journal records: Kubernetes conditions, the Sandbox controller's status.operation.
OTHER_SCHEMAS = {
    ("runs/cluster.py", '(ready or {}).get("reason")'),
    ("runs/cluster.py", 'failed.get("reason")'),
    ("cli/render.py", 'row.get("reason")'),
    ("kube/sandbox/controller.py", 'op.get("snapshotId")'),
    ("kube/sandbox/controller.py", '(self._condition(view, "Suspended") or {}).get("reason")'),
    # The call API's URL path of a snapshot on request, not a journal op id.
    ("sessions/http.py", 'Route(prefix + "/snapshot", _snapshot(service), methods=["POST"])'),
}


def test_no_module_but_the_owner_decodes_a_sessions_records() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        # providers/ never see the journal (they import nothing of the engine; import-linter keeps it so):
        # what they read is the documents of their own back ends (a Pod's status, an exec's answer).
        if rel in WRITERS_AND_OWNER or rel.startswith("providers/"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DECODING.search(line) and not any(rel == f and text in line for f, text in OTHER_SCHEMAS):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "decode sandbox records through sandboxes/journal.py:\n" + "\n".join(found)


def test_the_engine_imports_nothing_of_sandboxes() -> None:
    engine = PACKAGE / "engine"
    offenders = [p.name for p in engine.rglob("*.py") if "durable_sandbox.sandboxes" in p.read_text()]
    assert offenders == []


def test_the_op_id_forms() -> None:
    s = "work/a/box"  # a session inside a parallel branch: its id has slashes of its own
    assert journal.provision_id(s) == "work/a/box/provision"
    assert journal.snapshot_id(s, 4) == "work/a/box/snapshot/4"
    assert journal.snapshot_id(s, 4, 2) == "work/a/box/snapshot/4~2"
    assert journal.delete_id(journal.snapshot_id(s, 4)) == "work/a/box/snapshot/4/delete"
    assert journal.restore_id(s, 1) == "work/a/box/restore/1"
    assert journal.destroy_id(s, "sbx-1") == "work/a/box/destroy/sbx-1"
    assert journal.finalize_id(s, 1) == "work/a/box/finalize~1"
    assert journal.reserved_operation_id("snapshot/3") and not journal.reserved_operation_id("snapshots")
    restore = OperationRecord(journal.restore_id(s, 1), OpKind.SANDBOX_RESTORE.value, "fresh", "completed",
                              result={"id": "sbx-2", "provider": "local"},
                              meta={journal.META_REASON: journal.REASON_RECOVERY})
    made = journal.provisioned(restore)
    assert made == journal.Provisioned(session=s, provider="local", sandbox_id="sbx-2", recovery=True)


@pytest.mark.parametrize("retain", [False, True])
async def test_a_sessions_records_read_back_as_what_happened(tmp_path: Path, retain: bool) -> None:
    import durable_sandbox as ds

    @ds.workflow(name=f"journal-reads-{retain}")
    async def flow(ctx: ds.Context, _: None) -> None:
        async with ctx.sandbox("box", provider="local", snapshot_every=1, retain_latest_snapshot=retain) as sbx:
            await sbx.shell("echo one")
            await sbx.shell("echo two")

    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id="w")
    try:
        state = await engine.run(flow, None, run_id="r")
        rows = await engine.history("r")
    finally:
        await engine.aclose()
        await store.close()
    assert state.status == "succeeded"
    made = [p for r in rows if (p := journal.provisioned(r)) is not None]
    assert [(p.session, p.provider, p.recovery) for p in made] == [("box", "local", False)]
    taken = [t for r in rows if (t := journal.snapshot_taken(r)) is not None]
    deleted = [d for r in rows if (d := journal.snapshot_deleted(r)) is not None]
    assert len(taken) == 2 and deleted == (taken[:1] if retain else taken)
    kept = [k for r in rows if (k := journal.retained(r)) is not None]
    assert kept == ([journal.Retained("box", taken[1])] if retain else [])
    assert journal.live_snapshots(rows) == state.snapshots == (taken[1:] if retain else [])
    assert [journal.call_target(r) for r in rows if r.kind == OpKind.SANDBOX_CALL.value and r.status == "started"] == [
        "echo one", "echo two"]
    assert sum(journal.finalized(r) for r in rows) == 1 and journal.sessions_in(rows) == ["box"]
