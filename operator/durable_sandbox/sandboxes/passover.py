"""A sandbox passed over by ``ctx.continue_as_new``: the old run hands its live sandbox to the next run of the
chain, which uses it without provisioning (engine/continue_as_new.py says the order of the two sides).

The old run (:func:`pass_on`, when ``ContinueAsNew`` leaves an open ``ctx.sandbox`` block): with checkpoints on
(``snapshot_every``), a snapshot of everything the session did (taken now unless the newest already has it)
passes along; older snapshots and unadopted sandboxes are removed as a finalization would; then one closing
record (kind ``sandbox.destroy``, ``finalized``) names the next run, the sandbox and the snapshot. Being a
finalization, nothing of the old run (cleanup, a cancel, a delete) touches them afterwards.

The next run (:func:`adopt`, when its block opens with nothing recorded yet): if its ``continued-from`` label names
a run whose journal passed this session to *this* run, it records the sandbox as its provision (and the snapshot
as its checkpoint at 0 calls, so a loss rebuilds from the workspace it inherited) instead of provisioning. From
then on the sandbox and the snapshot are the new run's, finalized with it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from durable_sandbox.engine import faults
from durable_sandbox.engine.continue_as_new import CONTINUED_FROM, HANDED_OVER_AFTER, ContinueAsNew
from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.providers.contract import ConfigurationError, SandboxHandle
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.call_records import handle_json
from durable_sandbox.sandboxes.factory import SessionFactory
from durable_sandbox.sandboxes.session import Checkpoint, SandboxSession
from durable_sandbox.sandboxes.traced import traced_provider

PASSED_TO = "passedTo"  # the closing record of a passed session: the run it went to
PASSED_HANDLE = "passedHandle"  # ... the sandbox
PASSED_SNAPSHOT = "passedSnapshot"  # ... the snapshot of everything it did (None without checkpoints)
ADOPTED_FROM = "adoptedFrom"  # the next run's provision and checkpoint: the run they came from


async def pass_on(session: SandboxSession, next_run_id: str) -> None:
    """Record ``session``'s live sandbox as passed to ``next_run_id`` (nothing if it is finalized already: a replay)."""
    st = session.state
    if st.finalized:
        return
    handle = await session.recoverer.live_handle()  # a hibernated session's sandbox is restored first
    keep = None
    if session.snapshot_every > 0:
        if st.latest is None or st.latest.count != st.completed:
            await session.checkpointer.checkpoint(st.completed)
        keep = st.latest
    for cp in list(st.checkpoints):
        if keep is None or cp.snapshot_id != keep.snapshot_id:
            await session.checkpointer.delete(cp)
    for pending in list(st.pending_handles):
        if pending.id != handle.id:
            await session.provisioner.destroy(pending, reason="finalize")
    await session.rt.write(OperationRecord(
        journal.finalize_id(session.sid, session.generation), OpKind.SANDBOX_DESTROY.value, "pass", "completed",
        1, None, None, epoch=session.rt.epoch,
        meta={journal.META_FINALIZED: True, journal.META_RETAINED: None, journal.META_SUCCEEDED: True,
              PASSED_TO: next_run_id, PASSED_HANDLE: handle_json(handle),
              PASSED_SNAPSHOT: keep.snapshot_id if keep else None, journal.META_PROVIDER: st.provider},
    ))
    faults.reach(f"passed:{session.sid}")  # recorded as passed; the next run not created yet
    st.finalized = True
    session.rt.emit("sandbox.passed", session=session.sid, sandbox=handle.id, to=next_run_id)


def _passed(rows: list[OperationRecord], sid: str, run_id: str) -> OperationRecord | None:
    found = None
    for r in rows:
        if journal.finalized(r) and journal.session_of(r) == sid and (r.meta or {}).get(PASSED_TO) == run_id:
            found = r
    return found


async def adopt(session: SandboxSession) -> bool:
    """Take over the sandbox the run before this one passed to it for this session; False if none was."""
    rt = session.rt
    run = await rt.store.get_run(rt.run_id)
    previous = run.labels.get(CONTINUED_FROM) if run is not None else None
    if not previous:
        return False
    after = run.labels.get(HANDED_OVER_AFTER, "0") if run is not None else "0"
    # Only what the old run wrote at the hand-over: a journal of 10,000 calls is not read to find it. A hand-over
    # that a crash cut short was recorded before the replay that created this run, so before that seq: then the
    # whole journal is read, once.
    passed = _passed(await rt.store.journal_since(previous, int(after) if after.isdigit() else 0), session.sid,
                     rt.run_id)
    if passed is None and after not in ("", "0"):
        passed = _passed(await rt.store.load_journal(previous), session.sid, rt.run_id)
    if passed is None:
        return False
    meta = passed.meta or {}
    if meta.get(journal.META_PROVIDER) not in (None, session.provider.name):
        raise ConfigurationError(
            f"Sandbox {session.sid!r}: run {previous!r} passed a sandbox of provider [{meta[journal.META_PROVIDER]}] "
            f"to run {rt.run_id!r}, which asks for [{session.provider.name}]; keep the provider across continue_as_new"
        )
    handle = SandboxHandle.model_validate(meta[PASSED_HANDLE])
    op_id = journal.provision_id(session.sid)
    prov = {journal.META_PROVIDER: session.provider.name, journal.META_OPTIONS: session._options(),
            ADOPTED_FROM: previous}
    records = [
        OperationRecord(op_id, OpKind.SANDBOX_PROVISION.value, session.provider.name, "started", meta=prov,
                        epoch=rt.epoch),
        OperationRecord(op_id, OpKind.SANDBOX_PROVISION.value, session.provider.name, "completed",
                        result=handle_json(handle), meta=prov, epoch=rt.epoch),
    ]
    snapshot = meta.get(PASSED_SNAPSHOT)
    if snapshot:
        snap_op = journal.snapshot_id(session.sid, 0, session.generation)
        records.append(OperationRecord(snap_op, OpKind.SANDBOX_SNAPSHOT.value, "snapshot", "completed",
                                       result={"snapshotId": snapshot}, meta={"count": 0, ADOPTED_FROM: previous},
                                       epoch=rt.epoch))
    await rt.write(*records)
    st = session.state
    st.handle, st.newest, st.provider = handle, handle.id, session.provider.name
    if snapshot:
        st.checkpoints.append(Checkpoint(0, str(snapshot), records[-1].op_id))
    rt.emit("sandbox.adopted", session=session.sid, sandbox=handle.id, fromRun=previous)
    return True


class PassingSession(SandboxSession):
    """A session that passes its sandbox on at ``continue_as_new`` and adopts one passed to its run."""

    async def __aenter__(self) -> SandboxSession:
        if not self.state.finalized and self.rt.lookup(journal.provision_id(self.sid)) is None:
            await adopt(self)
        return await super().__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if isinstance(exc, ContinueAsNew):
            await pass_on(self, exc.next_run_id)
            return
        await super().__aexit__(exc_type, exc, tb)


class PassingSessionFactory(SessionFactory):
    """``SessionFactory`` whose sessions pass over at ``continue_as_new`` (what ``durable_sandbox.Engine`` wires)."""

    def __call__(self, ctx: Any, id: str, *, provider: str = "local", **options: Any) -> SandboxSession:
        rt, sid = ctx.operations, ctx.scope + id
        return PassingSession(rt, sid, traced_provider(rt, sid, self.providers(provider)), **options)
