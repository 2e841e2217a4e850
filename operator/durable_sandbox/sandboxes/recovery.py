"""Recovering a lost sandbox: restore the newest checkpoint (or provision fresh), replay every completed call since
it in order with its original op id (identical outcomes required), at most ``MAX_RECOVERIES`` per run.

Order of effects: the restore is journaled ``started``; its replay plan is settled (an ``ask`` waits here, with no
sandbox made); the replacement is made and named in the journal before anything is replayed into it (a crash
mid-replay cannot leak it); a replacement that is not faithful is destroyed, never adopted; ``completed`` adopts it."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from durable_sandbox.engine import faults
from durable_sandbox.engine.records import ErrorInfo, OpKind
from durable_sandbox.providers.contract import SandboxGone, SandboxHandle
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.call_records import handle_json
from durable_sandbox.sandboxes.errors import (
    AttachedSandboxLost,
    ReconstructionError,
    RecoveryBudgetExhausted,
    ReplayAnswerInvalid,
)
from durable_sandbox.sandboxes.provisioning import Provisioner
from durable_sandbox.sandboxes.replay_policy import Replay, ReplayPlanner
from durable_sandbox.sandboxes.scope import SessionScope
from durable_sandbox.sandboxes.state import Checkpoint

T = TypeVar("T")

MAX_RECOVERIES = 3


class Recoverer:
    def __init__(self, scope: SessionScope, provisioner: Provisioner, planner: ReplayPlanner) -> None:
        self.scope = scope
        self.provisioner = provisioner
        self.planner = planner

    async def guarded(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` with transient errors retried and a loss recovered (then ``fn`` tried again)."""
        while True:
            try:
                return await self.provisioner.transient("operation", fn)
            except SandboxGone as gone:
                await self.recover(str(gone))

    async def live_handle(self) -> SandboxHandle:
        """The sandbox to use now: the journal's (its lease renewed), or one restored after hibernation."""
        handle = self.scope.state.handle
        if handle is None:
            await self.restore(reason="resume")
            handle = self.scope.state.handle
            assert handle is not None
            return handle
        return await self.provisioner.renewed(handle)

    async def recover(self, why: str) -> None:
        sc = self.scope
        if self.provisioner.attached_id() is not None:
            raise AttachedSandboxLost(
                f"Sandbox {sc.sid!r}: the sandbox of Sandbox resource {self.provisioner.attached_name()!r} "
                f"was lost ({why}); its controller re-creates it from its newest snapshot. Run the Workflow again "
                f"(or give it spec.retry) to continue in the re-created sandbox.", sc.state.handle)
        while True:
            if sc.state.recovery_attempts >= MAX_RECOVERIES:
                raise RecoveryBudgetExhausted(sc.sid, MAX_RECOVERIES)
            sc.rt.emit("sandbox.lost", session=sc.sid, reason=why)
            lost = sc.state.handle
            if lost is not None:
                await self.provisioner.destroy(lost, reason="lost")
            try:
                await self.restore(reason="recovery")
            except SandboxGone as again:  # the replacement was lost too while being rebuilt: another recovery
                why = str(again)
                continue
            break

    def interrupted(self) -> bool:
        """A restore was begun and neither finished nor failed (it waits for an answer, or a crash cut it short)."""
        rec = self.scope.lookup(journal.restore_id(self.scope.sid, self.scope.state.restores + 1))
        return rec is not None and rec.status == "started"

    async def finish_interrupted(self) -> None:
        """Finish an interrupted recovery now (a loss after the last call still rebuilds the workspace)."""
        try:
            await self.restore(reason=journal.REASON_RECOVERY)
        except SandboxGone as again:
            await self.recover(str(again))

    async def inject_loss(self, count: int) -> None:
        """Lose the sandbox on purpose after ``count`` calls (once per run), then recover it."""
        sc = self.scope
        op_id = journal.inject_loss_id(sc.sid, count)
        if sc.done(op_id):
            return
        handle = sc.state.handle
        await sc.write(op_id, OpKind.SANDBOX_INJECT_LOSS, "inject_loss", "started", meta={"count": count})
        if handle is not None:
            await sc.provider.inject_loss(handle)
        await sc.write(op_id, OpKind.SANDBOX_INJECT_LOSS, "inject_loss", "completed",
                       meta={journal.META_COUNT: count, journal.META_SANDBOX_ID: handle.id if handle else None})
        await self.recover("loss injected")

    async def restore(self, *, reason: str) -> None:
        """Make a replacement sandbox from the newest checkpoint (or fresh), replay the calls since it."""
        sc = self.scope
        number = sc.state.restores + 1
        op_id = journal.restore_id(sc.sid, number)
        prev = sc.lookup(op_id)
        if prev is not None and prev.status == "started":  # finishing a restore a crash interrupted: same reason
            reason = (prev.meta or {}).get(journal.META_REASON, reason)
        cp = sc.state.latest
        source = cp.snapshot_id if cp else "fresh"
        meta: dict[str, Any] = {journal.META_REASON: reason, journal.META_SNAPSHOT_ID: cp.snapshot_id if cp else None,
                                "fromCount": cp.count if cp else 0}
        if prev is not None and prev.status == "started":
            for h in sc.state.pending_handles:  # a half-finished restore from before a crash
                await self.provisioner.destroy(h, reason="abandoned")
            # The crash (or a lost lease: another replica takes the run over) may have come between the
            # provider making the replacement and the journal naming it.
            await self.provisioner.reap_unrecorded()
        await sc.write(op_id, OpKind.SANDBOX_RESTORE, source, "started", meta=meta)
        try:
            # Before anything is made: a restore that waits for answers holds no sandbox (Suspend passes through).
            plan, asked = await self.planner.plan(cp.count if cp else 0)
        except ReplayAnswerInvalid as exc:
            await self._failed(op_id, number, cp, meta, exc)
            raise
        handle = await self.provisioner.make(op_id, cp)
        faults.reach(f"provisioned:{op_id}")  # made, not yet journaled: reaped when the restore is finished
        # Record the new sandbox before replaying into it, so a crash mid-replay cannot leak it.
        await sc.write(op_id, OpKind.SANDBOX_RESTORE, source, "started", meta={**meta, "handle": handle_json(handle)})
        sc.state.pending_handles.append(handle)
        try:
            replayed, skipped = await self._replay(handle, plan)
        except BaseException as exc:
            # A replacement that is not faithful (or could not be finished) is destroyed, never adopted.
            await self.provisioner.destroy(handle, reason="rejected")
            await self._failed(op_id, number, cp, meta, exc)
            raise
        await sc.write(op_id, OpKind.SANDBOX_RESTORE, source, "completed", result=handle_json(handle),
                       meta={**meta, journal.META_REPLAYED: replayed, journal.META_SKIPPED: skipped,
                             journal.META_ASKED: asked})
        sc.state.handle, sc.state.newest = handle, handle.id
        sc.state.restores = number
        if reason == "recovery":
            sc.state.recoveries += 1
            sc.state.recovery_attempts += 1

    async def _replay(self, handle: SandboxHandle, plan: list[Replay]) -> tuple[list[str], list[str]]:
        """Execute the plan's reruns into ``handle`` in order, each outcome checked; (replayed, skipped) op ids."""
        replayed: list[str] = []
        skipped: list[str] = []
        for step in plan:
            if not step.rerun:  # skip: not executed again; its journaled result stands
                skipped.append(step.op_id)
                continue
            call = self.planner.recorded_call(step.op_id, step.position)
            # Transient provider errors are retried here too; a loss escapes to recover (try again).
            run = functools.partial(self.scope.provider.execute, handle, call)
            outcome = (await self.provisioner.transient("replay", run)).capped()
            if outcome.outcome != step.recorded.outcome:
                raise ReconstructionError(self.scope.local(step.op_id), step.recorded, outcome)
            replayed.append(step.op_id)
        return replayed, skipped

    async def _failed(self, op_id: str, number: int, cp: Checkpoint | None, meta: dict[str, Any],
                      exc: BaseException) -> None:
        """Journal restore ``number`` as failed (it counts against the recovery budget when it was one)."""
        sc = self.scope
        await sc.write(op_id, OpKind.SANDBOX_RESTORE, cp.snapshot_id if cp else "fresh", "failed", meta=meta,
                       error=ErrorInfo.from_exception(exc, retryable=False))
        sc.state.restores = number
        if meta.get(journal.META_REASON) == journal.REASON_RECOVERY:
            sc.state.recovery_attempts += 1
