"""A snapshot a caller asks for (``POST .../snapshot``): taken now, journaled like the every-N-calls ones.

The live sandbox is first brought to hold every completed session call (``rebuild.py``), then snapshot under the
Sandbox's call journal as a checkpoint at that count (``sandboxes/checkpoints.py``: ``started``, taken,
``completed`` with its id, then the checkpoint it supersedes deleted), with the request's operation id in its
record: a loss afterwards restores it, and the same request again finds it instead of taking another.

A rewind to fewer calls than it holds deletes it like an every-N one (``rewind.py``): it is stale
(``sandboxes/holdings.py``), never restored, and the same request again is refused (409) rather than answered
with a snapshot that is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.kube.sandbox.view import CALLS_SESSION
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.holdings import holdings
from durable_sandbox.sandboxes.session import SandboxSession
from durable_sandbox.sandboxes.traced import traced_provider
from durable_sandbox.sessions.errors import CallRefused

__all__ = ["Snapshot", "snapshot_taken", "take_snapshot"]


@dataclass(frozen=True)
class Snapshot:
    operation_id: str
    snapshot_id: str
    calls: int  # the session calls it holds
    replayed: bool = False  # answered from the journal: taken for an earlier request with this operation id


def snapshot_taken(rows: Sequence[OperationRecord], operation_id: str, *, where: str) -> Snapshot | None:
    """The snapshot the journal recorded for request ``operation_id``, if any; refused (409) if a rewind since
    deleted it (it held calls the rewind undid)."""
    for r in rows:
        meta = r.meta or {}
        if (r.kind == OpKind.SANDBOX_SNAPSHOT.value and r.status == "completed" and r.op_id.startswith(CALLS_SESSION + "/")
                and meta.get(journal.META_REQUEST) == operation_id):
            snapshot_id = str(r.result["snapshotId"])
            if snapshot_id in holdings(rows, CALLS_SESSION).stale:
                raise CallRefused(409, f"operationId {operation_id!r} names snapshot {snapshot_id}, which held calls "
                                  "since rewound (deleted by the rewind)", where=f"{where}, operationId",
                                  do="ask for a snapshot under a new operationId: it holds the calls the rewind kept "
                                  "and those since")
            return Snapshot(operation_id, snapshot_id, int(meta["count"]), replayed=True)
    return None


async def take_snapshot(rt: RunRuntime, handle: SandboxHandle, provider: SandboxProvider, operation_id: str,
                        handles: dict[str, SandboxHandle], *, sandbox: str, owner: str, snapshot_every: int,
                        count: int) -> Snapshot:
    """Snapshot ``handle`` (holding the ``count`` completed session calls of Sandbox ``sandbox``, whose owner tag is
    ``owner``) as the session's newest checkpoint."""
    handles[rt.run_id] = handle  # what the session attaches to (SandboxServices.attached)
    try:
        session = SandboxSession(rt, CALLS_SESSION, traced_provider(rt, CALLS_SESSION, provider), attach=sandbox,
                                 owner=owner, next_index=count, snapshot_every=snapshot_every)
        await session.__aenter__()  # journals the attach once (``calls/provision``)
        session.state.handle = handle
        await session.checkpointer.checkpoint(count, request=operation_id)
    finally:
        handles.pop(rt.run_id, None)
    taken = snapshot_taken(rt.rows, operation_id, where=f"Sandbox {sandbox}")
    if taken is not None:
        return Snapshot(operation_id, taken.snapshot_id, taken.calls)
    # A checkpoint at this count was recorded already (every N calls, or asked for before): that one holds them.
    newest = session.state.checkpoints[-1]
    return Snapshot(operation_id, newest.snapshot_id, newest.count)
