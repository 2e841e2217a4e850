"""Checkpoints: a snapshot every ``snapshot_every`` calls, recorded, then the one it supersedes deleted.

Order of effects: the snapshot is journaled ``started`` under a stable op id (the provider's operation id derives
from it, so a provider with an idempotent snapshot answers a retry with the same one), taken, journaled
``completed`` with its id; only then is the superseded checkpoint deleted (``started``, deleted, ``completed``)."""

from __future__ import annotations

import hashlib

from durable_sandbox.engine import faults
from durable_sandbox.engine.records import OpKind
from durable_sandbox.sandboxes import fork_journal, journal, retries
from durable_sandbox.sandboxes.recovery import Recoverer
from durable_sandbox.sandboxes.scope import SessionScope
from durable_sandbox.sandboxes.services import SandboxServices
from durable_sandbox.sandboxes.state import Checkpoint


class Checkpointer:
    def __init__(self, scope: SessionScope, recoverer: Recoverer) -> None:
        self.scope = scope
        self.recoverer = recoverer  # a sandbox lost while being snapshotted is recovered, then snapshotted
        self.keep_all = False  # every checkpoint kept until the end: points to fork from (``keep_checkpoints``)

    async def checkpoint(self, count: int, *, fresh: bool = True, request: str | None = None) -> None:
        """Snapshot at ``count`` calls, record it, then delete the checkpoint it supersedes. Not ``fresh``: the
        sandbox does not hold exactly ``count`` calls (a re-opened session replaying), so only a checkpoint
        already recorded applies. ``request``: the operation id of a snapshot asked for (the call API's
        ``snapshot``), recorded with it so that the same request again finds it."""
        sc = self.scope
        # A re-opened session's snapshots get ids of their own: the failed attempt's were deleted.
        op_id = journal.snapshot_id(sc.sid, count, sc.generation, sc.state.rewinds)
        recorded = sc.done(op_id)
        if not fresh and not recorded:
            return
        if not recorded:
            provider_op = "dsv1s_" + hashlib.sha256(f"{sc.rt.run_id}\0{op_id}".encode()).hexdigest()[:40]

            async def take() -> str:
                return await sc.provider.snapshot(await self.recoverer.live_handle(), operation_id=provider_op)

            meta: dict[str, object] = {"count": count, "operationId": provider_op}
            if request is not None:
                meta[journal.META_REQUEST] = request
            await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "started", meta=meta)
            snapshot_id = await self.recoverer.guarded(take)
            faults.reach(f"snapshot-taken:{op_id}")
            await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "completed", result={"snapshotId": snapshot_id},
                           meta=dict(meta))
            faults.reach(f"snapshot-recorded:{op_id}")
            sc.state.checkpoints.append(Checkpoint(count, snapshot_id, op_id))
        for old in [c for c in sc.state.checkpoints if c.count < count and not self.keep_all]:
            await self.delete(old)

    async def delete(self, cp: Checkpoint) -> None:
        sc = self.scope
        op_id = journal.delete_id(cp.op_id)
        meta = {journal.META_SNAPSHOT_ID: cp.snapshot_id}
        await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT_DELETE, "delete", "started", meta=meta)
        await retries.cleanup(f"delete snapshot {cp.snapshot_id}",
                              lambda: fork_journal.delete_own(sc.provider, cp.snapshot_id, cp.borrowed),
                              SandboxServices.of(sc.rt).cleanup_attempts)
        faults.reach(f"snapshot-deleted:{op_id}")  # deleted, not yet journaled: deleting again is a no-op
        await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT_DELETE, "delete", "completed", meta=meta)
        sc.state.checkpoints = [c for c in sc.state.checkpoints if c.snapshot_id != cp.snapshot_id]
