"""A Sandbox made from another's session (``spec.from: {sandbox: NAME, afterCall: N}``): its journal seeded with the
source's first ``N`` calls, so that its workspace is rebuilt from them like after a loss.

When the fork's session is first opened (its first call, or a rewind), under its journal's lease and in one commit:

1. ``calls/from/1`` (kind ``fork``): the source's name and uid (as the API server gave them when it was found,
   in the fork's own namespace: never another's), and ``N``;
2. the source's completed calls ``0 .. N-1`` as its session derives them (rewound calls are not its), with
   their arguments, ``onReplay`` and results, under the same operation ids (a retry of one answers from the
   journal), without the sandbox each ran in (the fork's sandboxes are its own);
3. the source's newest snapshot at or before ``N`` (if any), as a *borrowed* checkpoint: ``fork_restore.py`` copies
   it into one of the fork's own before the first call runs (``snapshot_copy``), and lets the borrowed one go.

Nothing else of the source's is taken: no sandbox, no snapshot to keep (the fork restores its own copy; each
snapshot is deleted once, by its owner, whatever the order the source and the fork are deleted in), no env value
(the journal keeps none: the fork's env is its spec's). The fork's live sandbox is provisioned fresh by its
controller and holds no call: when the fork owns a copy, it is given back and restored from the copy, and the call
that opens the session replays only the calls after it; otherwise all ``N`` calls are replayed into it, in order,
with the outcome check (``rebuild.py``); one whose outcome differs fails that call with expected vs actual. A crash
before the commit leaves nothing seeded (the next call seeds again); after it the source is needed only until the
copy is made.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.kube.sandbox.view import CALLS_SESSION, calls_run_id
from durable_sandbox.kube.spec.plan import cluster_run_id as workflow_run_id
from durable_sandbox.sandboxes import fork_journal, journal
from durable_sandbox.sandboxes.fork_journal import ForkRefused
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.sessions.errors import CallRefused


class ForkTarget(Protocol):
    """The fork being seeded: a ``journal.SandboxRef`` (which imports this module, so named by its shape)."""

    @property
    def namespace(self) -> str: ...

    @property
    def where(self) -> str: ...


class SourceFinder(Protocol):
    """What finds the source Sandbox in the fork's namespace: a ``rebuild.SandboxAccess``."""

    async def find(self, namespace: str, name: str) -> Any: ...

log = logging.getLogger("durable_sandbox.sessions")

__all__ = ["FORK_KIND", "FROM_OP", "ForkTarget", "SourceFinder", "SourceRef", "seed_fork", "seed_records", "seeded"]

FROM_OP = f"{CALLS_SESSION}/from/1"  # an operationId has no "/": never a call's
FORK_KIND = "fork"


@dataclass(frozen=True)
class SourceRef:
    """``spec.from`` as the fork's spec says it (the source's uid is read when the session is seeded)."""

    sandbox: str | None
    workflow: str | None
    after_call: int
    # A Workflow source's uid, as the API server gave it when the fork was found (its run is <name>-<uid[:8]>)
    workflow_uid: str | None = None

    @property
    def name(self) -> str:
        return f"Sandbox {self.sandbox}" if self.sandbox is not None else f"Workflow {self.workflow}"

    def where(self, fork: str) -> str:
        return f"{fork}, spec.from"


def seeded(rt: RunRuntime) -> bool:
    return rt.lookup(FROM_OP) is not None


def seed_records(rt: RunRuntime, source_rows: list[OperationRecord], source: SourceRef, source_uid: str,
                 where: str, source_session: str = CALLS_SESSION, *, source_run: str = "") -> list[OperationRecord]:
    """The records that make the fork's journal start with the source's first ``after_call`` calls (of session
    ``source_session``: a Workflow's run's, renamed into the fork's own session), then the source's newest snapshot
    at or before them, borrowed (``fork_restore.py`` copies it into one of the fork's own)."""
    state = SessionState.derive(source_session, source_rows)
    if source.after_call > state.completed:
        raise CallRefused(409, f"spec.from.afterCall is {source.after_call}, but {source.name} has "
                          f"completed {state.completed} session calls", where=where,
                          do=f"create the fork with afterCall at most {state.completed}, or wait for the source's "
                          "calls first")
    first: dict[str, OperationRecord] = {}
    done: dict[str, OperationRecord] = {}
    for row in source_rows:
        if row.status == "started":
            first.setdefault(row.op_id, row)
        elif row.status == "completed":
            done[row.op_id] = row
    named = {"sandbox": source.sandbox} if source.sandbox is not None else {"workflow": source.workflow}
    origin = {**named, "uid": source_uid, "afterCall": source.after_call}
    out = [OperationRecord(FROM_OP, FORK_KIND, "from", "completed", epoch=rt.epoch, result=dict(origin),
                           meta=dict(origin))]
    for index in range(source.after_call):
        op_id = state.calls[index][0]
        started, completed = first.get(op_id), done[op_id]  # a read-only call has no started record
        meta = {k: v for k, v in (completed.meta or {}).items() if k != journal.META_SANDBOX_ID}
        own = _own_op_id(op_id, source_session, completed)
        if started is not None:
            out.append(OperationRecord(own, OpKind.SANDBOX_CALL.value, started.name, "started", 1,
                                       started.input_digest, meta=dict(started.meta or {}), epoch=rt.epoch))
        out.append(OperationRecord(own, OpKind.SANDBOX_CALL.value, completed.name, "completed", 1,
                                   completed.input_digest, completed.result, meta=meta, epoch=rt.epoch))
    point = fork_journal.restore_point(state.checkpoints, source.after_call)
    if point is not None:
        borrowed = fork_journal.Borrowed(point.count, point.snapshot_id, source_run or source_uid)
        out.append(fork_journal.borrowed_record(CALLS_SESSION, borrowed, epoch=rt.epoch))
    return out


def _own_op_id(op_id: str, session: str, row: OperationRecord) -> str:
    """The call's op id in the fork's session: the same operation id, under ``calls/``."""
    if session == CALLS_SESSION:
        return op_id
    given = (row.meta or {}).get(journal.META_OPERATION_ID)
    return f"{CALLS_SESSION}/{given if isinstance(given, str) else op_id[len(session) + 1:]}"


async def seed_fork(store: Any, ref: ForkTarget, source: SourceRef, rt: RunRuntime, gate: SourceFinder) -> None:
    """A fork's journal seeded with its source's first calls, in one commit (``fork_seed.py``)."""
    where = source.where(ref.where)
    if source.sandbox is None:
        await _seed_from_workflow(store, ref, source, rt, where)
        return
    try:
        found = await gate.find(ref.namespace, source.sandbox)  # in the fork's own namespace, never another
    except CallRefused as missing:
        raise CallRefused(409, f"the source Sandbox {source.sandbox} cannot be read: {missing.body.what}",
                          where=where, do="create the fork from a Sandbox of this namespace that exists (its "
                          "calls are copied at the fork's first call)") from None
    rows = await store.load_journal(calls_run_id(found.uid))
    await rt.write(*seed_records(rt, rows, source, found.uid, where, source_run=calls_run_id(found.uid)))
    log.info("%s: forked from Sandbox %s (uid %s) after its call %d", ref.where, source.sandbox, found.uid,
             source.after_call)

async def _seed_from_workflow(store: Any, ref: ForkTarget, source: SourceRef, rt: RunRuntime, where: str) -> None:
    """``spec.from.workflow``: the source Workflow (found in the fork's own namespace, its uid read then) has
    one run, ``<name>-<uid[:8]>``; its one sandbox session's first calls become the fork's."""
    assert source.workflow is not None
    uid = source.workflow_uid
    rows = await store.load_journal(workflow_run_id(source.workflow, uid)) if uid else []
    if not rows:
        raise CallRefused(409, f"the source Workflow {source.workflow} cannot be read: "
                          f"{'no such Workflow' if not uid else 'it has no run yet'}", where=where,
                          do="create the fork from a Workflow of this namespace that has run (its calls are "
                          "copied at the fork's first call)")
    try:
        sid = fork_journal.session_to_fork(rows, None)
    except ForkRefused as exc:
        raise CallRefused(409, f"Workflow {source.workflow}'s run cannot be forked: {exc}", where=where,
                          do="fork a Workflow whose run used one sandbox session (toolCalls do)") from None
    await rt.write(*seed_records(rt, rows, source, uid or "", where, source_session=sid,
                                 source_run=workflow_run_id(source.workflow, uid or "")))
    log.info("%s: forked from Workflow %s (uid %s) after its call %d", ref.where, source.workflow, uid,
             source.after_call)
