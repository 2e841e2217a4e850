"""What a Sandbox's session sandboxes and snapshots hold, from its journal (sessions/rebuild.py decides with it;
the Sandbox controller asks it which sandboxes hold rewound calls: kube/sandbox/operations.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.sandboxes import journal, rewind_journal

__all__ = ["Holdings", "holdings"]


@dataclass
class Holdings:
    """What the journal says the session's sandboxes and snapshots hold (see :func:`holdings`)."""

    held: dict[str, int] = field(default_factory=dict)  # sandbox id -> the session calls it holds
    snapshots: dict[str, int] = field(default_factory=dict)  # the session's snapshot id -> the calls it holds
    cut: set[str] = field(default_factory=set)  # sandboxes whose rebuild was cut short
    stale: set[str] = field(default_factory=set)  # sandboxes and snapshots holding calls since rewound
    rewinds: int = 0

    def rewind(self, to_call: int) -> None:
        """The calls from ``to_call`` on were rewound: what holds any of them is stale, never used again."""
        for table in (self.held, self.snapshots):
            for key in [k for k, count in table.items() if count > to_call]:
                del table[key]
                self.stale.add(key)
        self.rewinds += 1

    def fold(self, r: OperationRecord, sid: str) -> None:
        """One more journal row of session ``sid``'s run, in commit order (:func:`holdings` folds them all)."""
        meta = r.meta or {}
        if (rewound := rewind_journal.rewind_of(r)) is not None:
            self.rewind(rewound.to_call)
        elif r.op_id.startswith(journal.REBUILD + "/"):
            sandbox = str(meta.get("sandbox"))
            if r.status == "completed":
                self.held[sandbox] = int(meta["count"])
                self.cut.discard(sandbox)
            else:
                self.cut.add(sandbox)
        elif r.status != "completed" or not r.op_id.startswith(sid + "/"):
            return
        elif r.kind == OpKind.SANDBOX_CALL.value and meta.get(journal.META_SANDBOX_ID):
            sandbox = str(meta[journal.META_SANDBOX_ID])
            self.held[sandbox] = max(self.held.get(sandbox, 0), int(meta[journal.META_INDEX]) + 1)
        elif r.kind == OpKind.SANDBOX_SNAPSHOT.value:
            self.snapshots[str(r.result["snapshotId"])] = int(meta["count"])


def holdings(rows: Sequence[OperationRecord], sid: str) -> Holdings:
    """From the journal, in commit order: what each sandbox and snapshot holds (a call completed in it, a rebuild
    of it, the session's snapshots), the sandboxes whose rebuild was cut short, and what rewinds made stale."""
    h = Holdings()
    for r in rows:
        h.fold(r, sid)
    return h
