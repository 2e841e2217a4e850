"""What the run page calls each journal row, and of which kind it is: pure functions of the row, apart from the
timeline that places the rows (ui/timeline.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.engine.wording import counted
from durable_sandbox.sandboxes import journal, rewind_journal

# The kinds as plain strings: an enum's .value is a property, far too slow in a loop over a 10,000-call journal.
CALLBACK = OpKind.CALLBACK.value
PARALLEL = OpKind.PARALLEL.value
PATCH = OpKind.PATCH.value
SANDBOX_CALL = OpKind.SANDBOX_CALL.value
SANDBOX_DESTROY = OpKind.SANDBOX_DESTROY.value
SANDBOX_INJECT_LOSS = OpKind.SANDBOX_INJECT_LOSS.value
SANDBOX_PROVISION = OpKind.SANDBOX_PROVISION.value
SANDBOX_RESTORE = OpKind.SANDBOX_RESTORE.value
SANDBOX_SNAPSHOT = OpKind.SANDBOX_SNAPSHOT.value
SANDBOX_SNAPSHOT_DELETE = OpKind.SANDBOX_SNAPSHOT_DELETE.value
SLEEP = OpKind.SLEEP.value
STEP = OpKind.STEP.value

__all__ = ["rewind_note", "row_kind", "row_label"]

_KINDS: Final[Mapping[str, str]] = {
    STEP: "step",
    PARALLEL: "parallel",
    CALLBACK: "callback",
    SLEEP: "timer",
    PATCH: "patch",
    SANDBOX_PROVISION: "provision",
    SANDBOX_CALL: "call",
    SANDBOX_SNAPSHOT: "snapshot",
    SANDBOX_SNAPSHOT_DELETE: "snapshot-delete",
    SANDBOX_RESTORE: "restore",
    SANDBOX_INJECT_LOSS: "loss",
    SANDBOX_DESTROY: "destroy",
}

def _or_unknown(n: int | None) -> int | str:
    return "?" if n is None else n


def row_label(row: OperationRecord, targets: Mapping[str, str]) -> str:
    """What the timeline calls a journal row (a call by its target, as its started record named it)."""
    kind = row.kind
    if kind == SANDBOX_CALL:
        return targets.get(row.op_id, row.name)
    if kind == STEP:
        tail = row.op_id.rsplit("/", 1)[-1]
        return tail if tail == row.name else f"{tail} ({row.name})"
    if kind == SANDBOX_RESTORE and row.name == rewind_journal.REWIND:  # a Sandbox's session rewound
        rewound = (row.meta or {}).get(rewind_journal.META_REWOUND) or []
        return (f"rewind to after call {(row.meta or {}).get(rewind_journal.META_TO)}: "
                f"{counted(len(rewound), 'call')} rewound")
    if kind == SANDBOX_RESTORE and (rebuild := journal.rebuilt(row)) is not None:  # a Sandbox's session calls
        if rebuild.held >= rebuild.count:
            return f"sandbox {rebuild.sandbox} holds the first {counted(rebuild.count, 'call')}: nothing to replay"
        return f"rebuild sandbox {rebuild.sandbox}: replay calls {rebuild.held + 1} to {rebuild.count}"
    if kind == SANDBOX_RESTORE:
        source = journal.restored_from(row) or "nothing (fresh sandbox)"
        return f"{journal.reason(row) or 'restore'} from {source}"
    if kind == SANDBOX_SNAPSHOT:
        return f"snapshot after {counted(_or_unknown(journal.count(row)), 'call')}"
    if kind == SANDBOX_SNAPSHOT_DELETE:
        return f"delete snapshot {journal.deletion_of(row) or '?'}"
    if kind == SANDBOX_INJECT_LOSS:
        return f"sandbox lost (injected after {counted(_or_unknown(journal.count(row)), 'call')})"
    if kind == SANDBOX_DESTROY:
        if journal.finalized(row):
            return "finalize: snapshots deleted, sandbox destroyed"
        return f"{row.name} {journal.destroyed(row) or ''} ({journal.reason(row) or 'destroy'})".replace("  ", " ")
    if kind == SANDBOX_PROVISION:
        return f"provision ({row.name})"
    if kind == SLEEP:
        return f"sleep {row.op_id}"
    return row.op_id if kind in (CALLBACK, PARALLEL, PATCH) else row.name


def row_kind(row: OperationRecord) -> str:
    """The timeline's kind of a journal row (its colour and filter)."""
    meta = row.meta or {}
    if row.kind == SANDBOX_DESTROY:
        if journal.finalized(row):
            return "finalize"
        if journal.reason(row) == journal.REASON_HIBERNATE:
            return "hibernate"
    if row.kind == STEP and meta.get("branch"):
        return "branch"
    return _KINDS.get(row.kind, row.kind)


def rewind_note(row: OperationRecord) -> str | None:
    """A committed rewind's note: the calls it rewound (None: the row is no committed rewind)."""
    rewind = rewind_journal.rewind_of(row)
    if rewind is None:
        return None
    return "rewound (journaled, never deleted): " + ", ".join(op.split("/", 1)[-1] for op in rewind.rewound)
