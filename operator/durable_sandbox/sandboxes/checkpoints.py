"""Checkpoints: a snapshot every ``snapshot_every`` calls, recorded, then the one it supersedes deleted.

Order of effects: the snapshot is journaled ``started`` under a stable op id (the provider's operation id derives
from it, so a provider with an idempotent snapshot answers a retry with the same one), taken, journaled
``completed`` with its id; only then is the superseded checkpoint deleted (``started``, deleted, ``completed``)."""

from __future__ import annotations

import hashlib

from durable_sandbox.engine import faults
from durable_sandbox.engine.records import OpKind
from durable_sandbox.providers.contract import ProvisionError
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

    async def after_call(self, count: int, every: int, *, fresh: bool) -> None:
        """After the session's call ``count``: the checkpoint due every ``every`` calls, else (the sandbox holding
        exactly ``count`` calls) a snapshot at ``count`` its taker never recorded (a fork's maker killed after the
        fork was ready: sandboxes/fork.py) finished."""
        if every and count % every == 0:
            await self.checkpoint(count, fresh=fresh)
        elif fresh:
            await self.finish_interrupted(count)

    def interrupted_at(self, count: int) -> bool:
        """Whether the snapshot at ``count`` was journaled ``started`` and never ``completed``: its taker died (or
        failed) between asking the provider and recording the answer, so the provider may hold an object no
        record names yet."""
        sc = self.scope
        rec = sc.lookup(journal.snapshot_id(sc.sid, count, sc.generation, sc.state.rewinds))
        return rec is not None and rec.status == "started"

    async def finish_interrupted(self, count: int) -> None:
        """Take the interrupted snapshot at ``count`` again, under the same provider operation id (the same object
        when the provider made it), and record it: then it is rotated and deleted like every other. Only while
        the sandbox holds exactly ``count`` calls (a fork's own snapshot after it was ready: sandboxes/fork.py)."""
        if self.interrupted_at(count):
            await self.checkpoint(count)

    async def finish_interrupted_copies(self) -> None:
        """Record the copies of a borrowed checkpoint (a fork's, sandboxes/fork.py) journaled ``started`` and never
        ``completed``: asked for again under the same provider operation id, which finds the copy made (even once
        its source is gone); then they are deleted with the session's other snapshots. A copy never made whose
        source is gone is nothing to record."""
        sc = self.scope
        started = {r.op_id: r for r in sc.rt.known_rows()
                   if r.kind == OpKind.SANDBOX_SNAPSHOT.value and r.op_id.startswith(f"{sc.sid}/snapshot/copy-")}
        for op_id, rec in started.items():
            meta = dict(rec.meta or {})
            if sc.done(op_id) or not meta.get("copyOf") or not meta.get("operationId"):
                continue
            try:
                copy_id = await sc.provider.copy_snapshot(str(meta["copyOf"]), operation_id=str(meta["operationId"]))
            except ProvisionError:
                continue  # neither the copy nor its source is there
            await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "completed", result={"snapshotId": copy_id},
                           meta=meta)
            sc.state.checkpoints.append(Checkpoint(int(meta["count"]), copy_id, op_id))

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
