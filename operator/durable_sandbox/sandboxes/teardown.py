"""A session's end: hibernation while its run waits (checkpoint, then destroy) and finalization (destroy every
sandbox, reap the unrecorded ones, delete every snapshot but the retained one, then journal the session finalized)."""

from __future__ import annotations

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.providers.contract import Capability
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.checkpoints import Checkpointer
from durable_sandbox.sandboxes.provisioning import Provisioner
from durable_sandbox.sandboxes.scope import SessionScope


class Teardown:
    def __init__(self, scope: SessionScope, provisioner: Provisioner, checkpointer: Checkpointer) -> None:
        self.scope = scope
        self.provisioner = provisioner
        self.checkpointer = checkpointer

    async def hibernate(self) -> bool:
        """Checkpoint and destroy the sandbox while the run waits; it is restored when the run goes on."""
        sc = self.scope
        caps = sc.provider.capabilities()
        if sc.state.handle is None or sc.state.finalized or self.provisioner.attached_id() is not None:
            return False  # an attached sandbox is suspended by its Sandbox resource, not by the run
        if not (caps.supports(Capability.SNAPSHOT) and caps.supports(Capability.RESTORE)):
            return False
        count = sc.state.completed
        latest = sc.state.latest
        if latest is None or latest.count != count:
            await self.checkpointer.checkpoint(count)
        handle = sc.state.handle
        if handle is not None:
            await self.provisioner.destroy(handle, reason="hibernate")
        sc.rt.emit("sandbox.hibernated", session=sc.sid, count=count)
        return True

    async def finalize(self, *, succeeded: bool, retain_latest_snapshot: bool) -> None:
        sc = self.scope
        if sc.state.finalized:
            return
        keep = sc.state.latest if (succeeded and retain_latest_snapshot) else None
        for h in list(sc.state.pending_handles):
            await self.provisioner.destroy(h, reason="finalize")
        if sc.state.handle is not None:
            await self.provisioner.destroy(sc.state.handle, reason="finalize")
        # A create whose answer never reached the journal (an executor that lost its lease or died while a
        # provision or restore was in flight, then another took the run over) made a sandbox only its labels
        # name: the run's end is the last moment this session can find it before the orphan sweep.
        await self.provisioner.reap_unrecorded()
        for cp in list(sc.state.checkpoints):
            if keep is None or cp.snapshot_id != keep.snapshot_id:
                await self.checkpointer.delete(cp)
        await sc.rt.write(
            OperationRecord(
                journal.finalize_id(sc.sid, sc.generation),
                OpKind.SANDBOX_DESTROY.value, "finalize", "completed", 1, None, None,
                meta={journal.META_FINALIZED: True, journal.META_RETAINED: keep.snapshot_id if keep else None,
                      journal.META_SUCCEEDED: succeeded},
                epoch=sc.rt.epoch,
            )
        )
        sc.state.finalized = True
        sc.state.retained = keep.snapshot_id if keep else None
