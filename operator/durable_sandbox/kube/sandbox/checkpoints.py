"""The snapshots a Sandbox's session calls take (``spec.snapshotEveryNCalls``), as the Sandbox controller needs
them: to restore the newest snapshot after a loss, whichever took it (a suspend here, or the session every N
calls), and to delete them all with the Sandbox. The session journals its own snapshots (``dsbx.<uid>.calls``,
``sessions/journal.py``) and deletes the one a new one supersedes once the new one is recorded; this module only
reads them. And the record's lineage: which snapshot each sandbox came from, which sandbox each snapshot was
taken of, so that the session knows which of its calls a replacement sandbox already holds."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.kube.sandbox.view import CALLS_SESSION, calls_run_id
from durable_sandbox.kube.store.journals import JournalStores
from durable_sandbox.providers.contract import ProvisionError, SandboxGone, SandboxProvider
from durable_sandbox.sandboxes.holdings import holdings
from durable_sandbox.sandboxes.rewind_journal import rewind_of
from durable_sandbox.sandboxes.session import SessionState

__all__ = ["LINEAGE_KEPT", "SessionSnapshot", "delete_session_snapshots", "interrupted_copies", "session_points",
           "session_snapshots", "with_lineage"]

COPY_OF = "copyOf"  # meta of a fork's copy of its source's snapshot (sandboxes/fork.py, ForkSession.own_borrowed)
LINEAGE_KEPT = 32  # lineage entries kept in the record (the newest): a few recoveries and suspends back


@dataclass(frozen=True)
class SessionSnapshot:
    snapshot_id: str
    count: int  # the session calls it holds
    taken_at: float  # when its record was committed (epoch seconds)


async def session_snapshots(journals: JournalStores | None, namespace: str, uid: str) -> list[SessionSnapshot]:
    """The snapshots the Sandbox's session has recorded and not deleted, oldest first (none without a journal)."""
    return (await session_points(journals, namespace, uid))[0]


async def session_points(journals: JournalStores | None, namespace: str,
                         uid: str) -> tuple[list[SessionSnapshot], float, frozenset[str]]:
    """:func:`session_snapshots`; when the session was last rewound (epoch seconds, 0: never); and the sandboxes
    that hold rewound calls (stale: sessions/rebuild.py). A snapshot of the Sandbox's own taken before the rewind,
    or of a stale sandbox, holds rewound calls, so it is never restored again."""
    if journals is None:
        return [], 0.0, frozenset()
    rows = await journals.store_for(namespace).load_journal(calls_run_id(uid))
    state = SessionState.derive(CALLS_SESSION, rows)
    taken = {r.op_id: r.ts for r in rows if r.status == "completed"}
    rewound = max((r.ts for r in rows if rewind_of(r) is not None), default=0.0)
    # A borrowed one (a fork's source's, sessions/fork_restore.py) is never restored nor deleted here: its owner's.
    snapshots = [SessionSnapshot(c.snapshot_id, c.count, taken.get(c.op_id, 0.0)) for c in state.checkpoints
                 if not c.borrowed]
    return snapshots, rewound, frozenset(holdings(rows, CALLS_SESSION).stale)


def interrupted_copies(rows: Sequence[OperationRecord]) -> list[tuple[str, str]]:
    """(the snapshot copied, the provider operation id) of each copy a fork's session journaled as started and never
    as completed (the operator stopped between the two): the copy may exist, recorded nowhere else."""
    completed = {r.op_id for r in rows if r.status == "completed"}
    found: dict[str, tuple[str, str]] = {}
    for r in rows:
        meta = r.meta or {}
        if r.status == "started" and r.op_id not in completed and meta.get(COPY_OF) and meta.get("operationId"):
            found[r.op_id] = (str(meta[COPY_OF]), str(meta["operationId"]))
    return list(found.values())


async def delete_session_snapshots(journals: JournalStores | None, namespace: str, uid: str,
                                   provider: SandboxProvider) -> None:
    """The Sandbox's finalizer: every snapshot its session owns deleted (the ones it recorded, and a fork's copy
    interrupted before it was recorded: finished under its operation id, then deleted); never a borrowed one."""
    if journals is None:
        return
    rows = await journals.store_for(namespace).load_journal(calls_run_id(uid))
    for source, operation_id in interrupted_copies(rows):
        try:
            copy_id = await provider.copy_snapshot(source, operation_id=operation_id)
        except ProvisionError:
            continue  # the source is gone and the copy was never made: nothing to delete
        with contextlib.suppress(SandboxGone):
            await provider.delete_snapshot(copy_id)
    for snapshot in (await session_points(journals, namespace, uid))[0]:
        with contextlib.suppress(SandboxGone):
            await provider.delete_snapshot(snapshot.snapshot_id)


def with_lineage(lineage: Mapping[str, Any] | None, child: str, parent: str) -> dict[str, str]:
    """``lineage`` with ``child`` -> ``parent`` added (the newest ``LINEAGE_KEPT`` entries)."""
    entries = {str(k): str(v) for k, v in (lineage or {}).items() if k != child}
    entries[child] = parent
    return dict(list(entries.items())[-LINEAGE_KEPT:])
