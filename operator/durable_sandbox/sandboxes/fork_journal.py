"""The journal a fork of a run starts with: the source's history up to its call N, made the fork's own.

A fork of run ``R`` at call ``N`` (of sandbox session ``s``) is a new run whose journal is:

1. ``fork`` (kind ``fork``): names the source run, ``N``, the session, and the *lineage* (which run's ids
   the calls before ``N`` were derived from, so that the workflow code re-issuing them finds them);
2. the source's rows up to the completion of its call ``N`` (steps, callbacks, the session's calls), in
   order, with the session's *lifecycle* rows left out: the source's sandboxes and snapshots are the
   source's, never the fork's to destroy or delete (the trust rule: a fork is made by whoever may read the
   source, and must not be able to change what the source owns);
3. ``s/destroy/<source sandbox>`` recorded *detached* (the session has no sandbox of its own yet);
4. the checkpoint it is built from, ``s/snapshot/borrowed-<n>``, marked ``borrowed``: the session restores
   from it like from its own, and letting go of it journals the deletion without asking the provider
   (sandboxes/session.py, ``Checkpoint.borrowed``).

The fork then restores that checkpoint, replays the calls after it up to ``N`` (sandboxes/fork.py) and takes
a snapshot of its own at ``N`` before letting the borrowed one go: from then on nothing of the fork needs
anything of the source's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from durable_sandbox.engine.records import OperationRecord, OpStatus
from durable_sandbox.providers.contract import Capability, SandboxProvider
from durable_sandbox.sandboxes import journal


class Point(Protocol):
    """A checkpoint as a fork chooses one (``state.Checkpoint``; state.py reads fork records with this module)."""

    @property
    def count(self) -> int: ...

    @property
    def borrowed(self) -> bool: ...


P = TypeVar("P", bound=Point)

FORK_OP = "fork"  # the op id (and kind) of a fork's first record
BORROWED = "borrowed"  # meta of a checkpoint record: a snapshot another run owns
META_SOURCE = "source"
META_AFTER_CALL = "afterCall"
META_SESSION = "session"
META_LINEAGE = "lineage"  # [[upto, run id], ...]: calls with index < upto were derived from run id's ids

# The session's own bookkeeping: never copied into a fork (they name the source's sandboxes and snapshots).
_LIFECYCLE = frozenset({journal.SNAPSHOT, journal.SNAPSHOT_DELETE, journal.RESTORE, journal.INJECT_LOSS,
                        journal.DESTROY})


class ForkRefused(ValueError):
    """A fork that cannot be made from what the source's journal holds (said before anything is made)."""


@dataclass(frozen=True)
class Borrowed:
    """The checkpoint a fork restores from: a snapshot of ``owner`` after ``count`` calls."""

    count: int
    snapshot_id: str
    owner: str


def borrowed_op_id(sid: str, count: int) -> str:
    return f"{sid}/snapshot/{BORROWED}-{count}"


def restore_point(checkpoints: Sequence[P], after_call: int, provider: SandboxProvider | None = None) -> P | None:
    """The newest of a source's checkpoints a fork at ``after_call`` can start from (its own, not one it borrowed,
    holding at most ``after_call`` calls), when ``provider`` (if known yet) snapshots and restores; None: the fork
    replays all its calls. Both kinds of fork choose with it: a run's (``fork.py``) and a Sandbox's
    (``sessions/fork_seed.py``)."""
    caps = provider.capabilities() if provider is not None else None
    if caps is not None and not (caps.supports(Capability.SNAPSHOT) and caps.supports(Capability.RESTORE)):
        return None
    usable = [c for c in checkpoints if c.count <= after_call and not c.borrowed]
    return usable[-1] if usable else None


def borrowed_record(sid: str, borrowed: Borrowed, *, epoch: int = 0) -> OperationRecord:
    """The record of checkpoint ``borrowed`` in a fork's session ``sid``: restored from like its own, never deleted
    by it (letting go of it is journaled only)."""
    return OperationRecord(
        borrowed_op_id(sid, borrowed.count), journal.SNAPSHOT, "snapshot", OpStatus.COMPLETED.value,
        result={"snapshotId": borrowed.snapshot_id},
        meta={journal.META_COUNT: borrowed.count, BORROWED: True, META_SOURCE: borrowed.owner}, epoch=epoch)


def lineage(first: Mapping[str, OperationRecord]) -> list[tuple[int, str]]:
    """The (upto, run id) spans of a run's fork record; empty for a run that is no fork."""
    rec = first.get(FORK_OP)
    if rec is None or rec.kind != FORK_OP:
        return []
    return [(int(upto), str(run)) for upto, run in (rec.meta or {}).get(META_LINEAGE, [])]


def derivation_run(first: Mapping[str, OperationRecord], run_id: str, sid: str, index: int) -> str:
    """The run id whose derived operation ids call ``index`` of session ``sid`` has: a fork's calls before
    its fork point keep the ids they had in the run they were made in; every later call gets the fork's own."""
    rec = first.get(FORK_OP)
    if rec is None or (rec.meta or {}).get(META_SESSION) != sid:
        return run_id
    for upto, run in lineage(first):
        if index < upto:
            return run
    return run_id


def session_to_fork(rows: Sequence[OperationRecord], session: str | None) -> str:
    """The session a fork is of: the one named, or the run's only one."""
    sessions = journal.sessions_in(rows)
    if session is not None:
        if session not in sessions:
            raise ForkRefused(f"The run has no sandbox session {session!r}; it has: {', '.join(sessions) or 'none'}")
        return session
    if len(sessions) != 1:
        raise ForkRefused(f"The run has {len(sessions)} sandbox sessions ({', '.join(sessions) or 'none'}); "
                          f"name the one to fork (session=..., --session)")
    return sessions[0]


def _cut(rows: Sequence[OperationRecord], sid: str, after_call: int) -> int:
    """The position in ``rows`` just after the completion of call ``after_call - 1`` (0: after provisioning)."""
    if after_call == 0:
        for i, r in enumerate(rows):
            if r.kind == journal.PROVISION and r.op_id == journal.provision_id(sid) and r.status == OpStatus.COMPLETED:
                return i + 1
        raise ForkRefused(f"Sandbox session {sid!r} never made its sandbox; there is no state to fork")
    for i, r in enumerate(rows):
        if (r.kind == journal.CALL and r.status == OpStatus.COMPLETED and journal.session_of(r) == sid
                and journal.call_index(r) == after_call - 1):
            return i + 1
    done = sum(1 for r in rows if r.kind == journal.CALL and r.status == OpStatus.COMPLETED
               and journal.session_of(r) == sid)
    raise ForkRefused(f"Sandbox session {sid!r} completed {done} calls; cannot fork after call {after_call} "
                      f"(choose 0..{done})")


def fork_prefix(
    rows: Sequence[OperationRecord], *, source_run: str, sid: str, after_call: int, borrowed: Borrowed | None,
    origin: Mapping[str, Any] | None = None,
) -> list[OperationRecord]:
    """The journal a fork of ``source_run`` at ``after_call`` starts with (see the module's docstring)."""
    if after_call < 0:
        raise ForkRefused(f"afterCall must be >= 0, not {after_call}")
    cut = _cut(rows, sid, after_call)
    source_first: dict[str, OperationRecord] = {}
    for r in rows:
        source_first.setdefault(r.op_id, r)
    copied: list[OperationRecord] = []
    handle: dict[str, Any] | None = None
    for r in rows[:cut]:
        owner = journal.session_of(r)
        if owner is not None and owner != sid:
            raise ForkRefused(f"The run used sandbox session {owner!r} too before call {after_call} of {sid!r}; "
                              f"a fork rebuilds one session's workspace only")
        if r.kind in _LIFECYCLE or r.status == OpStatus.FAILED or r.kind == FORK_OP:
            continue
        meta = dict(r.meta or {})
        if r.kind == journal.PROVISION:
            if (meta.get(journal.META_OPTIONS) or {}).get("attach"):
                raise ForkRefused(f"Sandbox session {sid!r} ran in a Sandbox resource (attach); fork that Sandbox")
            meta.pop(journal.META_HANDLE, None)
            if r.status == OpStatus.COMPLETED:
                handle = r.result if isinstance(r.result, dict) else None
        copied.append(OperationRecord(r.op_id, r.kind, r.name, r.status, r.attempt, r.input_digest, r.result,
                                      error=r.error, meta=meta or None, ts=r.ts, epoch=0))
    spans = [(min(upto, after_call), run) for upto, run in lineage(source_first)
             if (source_first[FORK_OP].meta or {}).get(META_SESSION) == sid]
    spans = [s for s in spans if s[0] > 0] + [(after_call, source_run)]
    head = OperationRecord(FORK_OP, FORK_OP, f"fork of {source_run} after call {after_call}", OpStatus.COMPLETED.value,
                           result={**(origin or {}), META_SOURCE: source_run, META_AFTER_CALL: after_call},
                           meta={**(origin or {}), META_SOURCE: source_run, META_AFTER_CALL: after_call, META_SESSION: sid,
                                 META_LINEAGE: [[upto, run] for upto, run in spans]})
    tail: list[OperationRecord] = []
    if handle is not None and handle.get("id"):
        tail.append(OperationRecord(
            journal.destroy_id(sid, str(handle["id"])), journal.DESTROY, "detach", OpStatus.COMPLETED.value,
            meta={journal.META_SANDBOX_ID: handle["id"], journal.META_REASON: FORK_OP, journal.META_DETACHED: True}))
    if borrowed is not None:
        if borrowed.count > after_call:
            raise ForkRefused(f"checkpoint after {borrowed.count} calls is past the fork point {after_call}")
        tail.append(borrowed_record(sid, borrowed))
    return [head, *copied, *tail]


async def delete_own(provider: SandboxProvider, snapshot_id: str, borrowed: bool) -> None:
    """Delete a checkpoint's snapshot unless it is borrowed: another run's, which its owner deletes."""
    if not borrowed:
        await provider.delete_snapshot(snapshot_id)
