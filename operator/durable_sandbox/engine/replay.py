"""Replay by id: the run's journal folded per operation id, which ids this execution has entered, and which
recorded ones it has not reached yet (while any remain, the run replays history written by earlier code).

A recorded operation is matched to the code's call by its explicit id, never by call order; a different
kind, name or input at the same id, an id used twice, and a completed operation the code never reached
are each a NonDeterminismError or DuplicateOperationError that names both sides.
"""

from __future__ import annotations

from durable_sandbox.engine.errors import DuplicateOperationError, NonDeterminismError
from durable_sandbox.engine.records import OperationRecord, OpKind, OpStatus

COMPLETED = OpStatus.COMPLETED.value
# Sandbox lifecycle records (snapshots, restores, destroys) are the session's bookkeeping, never entered by
# workflow code, so they do not count as unreached.
_ENTERED_KINDS = frozenset(
    k.value
    for k in (OpKind.STEP, OpKind.PARALLEL, OpKind.CALLBACK, OpKind.SLEEP, OpKind.SANDBOX_PROVISION, OpKind.SANDBOX_CALL)
)
# What check_all_reached holds the code to (sandbox operations are the session's to check).
_CHECKED_KINDS = (OpKind.STEP.value, OpKind.PARALLEL.value, OpKind.CALLBACK.value, OpKind.SLEEP.value)


class ReplayLedger:
    """The journal as this execution knows it (``rows``, and per id its ``first`` and ``latest`` record) and
    the ids it has entered and not yet reached."""

    def __init__(self, rows: list[OperationRecord]) -> None:
        self.rows = rows
        self.latest: dict[str, OperationRecord] = {}
        self.first: dict[str, OperationRecord] = {}
        # (first, again): an operation's completion journaled twice; the first stands (``supersedes``).
        self.duplicates: list[tuple[OperationRecord, OperationRecord]] = []
        for row in rows:
            prev = self.latest.get(row.op_id)
            if prev is not None and not supersedes(prev, row):
                self.duplicates.append((prev, row))
                continue
            self.latest[row.op_id] = row
            self.first.setdefault(row.op_id, row)
        # Ids recorded before this execution that it has not reached yet (what ctx.patched needs to know).
        self.unreached = {op for op, rec in self.first.items() if rec.kind in _ENTERED_KINDS}
        self._replayed_rows = len(rows)  # rows[:n] were recorded by earlier executions
        self._entered: set[str] = set()

    def enter(self, op_id: str, kind: str, name: str, digest: str | None) -> OperationRecord | None:
        """Claim ``op_id`` for this execution: its latest record (None if new), once its first record is
        checked against what the code asks for."""
        if op_id in self._entered:
            raise DuplicateOperationError(op_id)
        self._entered.add(op_id)
        self.unreached.discard(op_id)
        first = self.first.get(op_id)
        if first is not None and (first.kind != kind or first.name != name or (
            digest is not None and first.input_digest is not None and first.input_digest != digest
        )):
            raise nondeterminism(op_id, first, kind, name, digest)
        return self.latest.get(op_id)

    def appended(self, records: list[OperationRecord]) -> None:
        """``records`` were committed: they are part of the journal now."""
        for rec in records:
            self.rows.append(rec)
            self.latest[rec.op_id] = rec
            self.first.setdefault(rec.op_id, rec)

    def check_all_reached(self) -> None:
        """Called when the workflow returned: an operation the journal records as completed that this
        execution never reached means the code changed under the run (typically a renamed id), which
        replay by id cannot see at the point of the call. Operations under a replayed parent (a completed
        parallel or branch returns without re-entering its children) count as reached; sandbox
        operations are the session's own bookkeeping and are not checked here."""
        for op_id in sorted(self.unreached, key=lambda op: self.first[op].seq):
            rec = self.latest[op_id]
            if rec.kind not in _CHECKED_KINDS or rec.status != COMPLETED:
                continue
            parts = op_id.split("/")
            if any("/".join(parts[:i]) in self._entered for i in range(1, len(parts))):
                continue
            recorded = {r.op_id for r in self.rows[: self._replayed_rows]}
            new = [r for r in self.rows[self._replayed_rows :] if r.op_id not in recorded]
            same = [r for r in new if r.kind == rec.kind and r.name == rec.name]
            asked = same[0] if same else (new[0] if new else None)
            raise NonDeterminismError(
                op_id,
                {"opId": op_id, "kind": rec.kind, "name": rec.name},
                {"opId": asked.op_id, "kind": asked.kind, "name": asked.name}
                if asked is not None
                else {"opId": "(never reached)", "kind": rec.kind, "name": rec.name},
            )


def supersedes(prev: OperationRecord, row: OperationRecord) -> bool:
    """Whether ``row`` is the operation's state after ``prev`` (its latest so far). Not when ``prev`` completed
    it already: a completion journaled twice (a commit written again after its answer was lost, before that
    was prevented: engine/deferred.py) must not change what replay returns, so the first stands, the one the
    run went on from; ``duplicate_notice`` reports it."""
    return not (prev.status == COMPLETED and row.status == COMPLETED)


def duplicate_notice(run_id: str, first: OperationRecord, again: OperationRecord) -> str:
    """What is logged, and the run's ``journal.duplicate`` event says, of a completion journaled twice."""
    same = first.result == again.result and first.error == again.error
    return (f"The journal of run {run_id!r} holds operation {first.op_id!r} completed twice (seq {first.seq} and "
            f"seq {again.seq}, {'the same result' if same else 'different results'}): replay uses the first "
            f"(seq {first.seq}) and ignores the second. The run goes on; the journal was written by a version "
            f"that could commit a completion again after the answer to its commit was lost.")


def nondeterminism(op_id: str, rec: OperationRecord, kind: str, name: str, digest: str | None) -> NonDeterminismError:
    """The error of a replay that met ``kind``/``name``/``digest`` where the journal recorded ``rec``."""
    return NonDeterminismError(
        op_id,
        {"kind": rec.kind, "name": rec.name, "inputDigest": rec.input_digest},
        {"kind": kind, "name": name, "inputDigest": digest if digest is not None else rec.input_digest},
    )
