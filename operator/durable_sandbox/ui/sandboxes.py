"""The sandboxes a run's journal says it has: live, hibernated, lost, finalized; and their snapshots.

A run's ``ctx.sandbox`` sessions (the Workflow manifest's ``toolCalls`` run in one named ``sandbox``)
are folded from the journal alone, so the local store and the cluster are read the same way and no
provider is asked anything: what the page shows is what the run recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.sandboxes import journal

__all__ = ["Session", "SessionFold"]

# What a destroy's reason makes of the session (sandboxes/journal.py names these reasons).
# (A rejected or abandoned replacement was never the session's live sandbox: it changes nothing.)
_AFTER_DESTROY: Final[Mapping[str, str]] = {journal.REASON_HIBERNATE: "hibernated", journal.REASON_LOST: "lost", journal.REASON_FINALIZE: "destroyed"}


@dataclass
class Session:
    id: str
    provider: str | None = None
    state: str = "provisioning"  # provisioning, live, hibernated, lost, destroyed, detached, finalized
    sandbox_id: str | None = None  # the live sandbox (None when there is none)
    sandboxes: list[str] = field(default_factory=list)  # every sandbox the session had, oldest first
    snapshots: dict[str, None] = field(default_factory=dict)  # live snapshot ids, oldest first
    retained: str | None = None  # the snapshot a succeeded run kept (retainLatestSnapshot)
    recoveries: int = 0

    @property
    def active(self) -> bool:
        """Holds something at a provider: a live or hibernated sandbox, or a snapshot."""
        return self.state in ("provisioning", "live", "hibernated", "lost") or bool(self.snapshots) or bool(self.retained)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "provider": self.provider, "state": self.state, "sandboxId": self.sandbox_id,
                "sandboxes": list(self.sandboxes), "snapshots": list(self.snapshots), "retained": self.retained,
                "recoveries": self.recoveries}  # fmt: skip


@dataclass
class SessionFold:
    """A run's sessions, and its calls counted as ``status.calls`` and the run page count them
    (``journal.Tally``)."""

    sessions: dict[str, Session] = field(default_factory=dict)
    tally: journal.Tally = field(default_factory=journal.Tally)
    last_seq: int = 0

    def feed(self, rows: Iterable[OperationRecord]) -> None:
        for row in rows:
            self.last_seq = max(self.last_seq, row.seq)
            self.tally.fold(row)
            sid = journal.session_of(row)
            if sid is None or row.kind == journal.CALL:
                continue
            self._fold(self.sessions.setdefault(sid, Session(sid)), row)

    def calls(self, total: int | None) -> tuple[int | None, int | None]:
        """(done, total): None, None for a run that made no sandbox call and has no total."""
        done, total = self.tally.calls(total)
        return (done, total) if total else (None, None)

    @staticmethod
    def _fold(s: Session, row: OperationRecord) -> None:
        if (pinned := journal.pinned_provider(row)) is not None:
            s.provider = pinned[1]
        elif row.kind == journal.PROVISION:
            s.provider = s.provider or row.name
        if row.status != "completed":
            return
        if (made := journal.provisioned(row)) is not None:
            if made.sandbox_id is not None:
                s.sandbox_id, s.state = made.sandbox_id, "live"
                if made.sandbox_id not in s.sandboxes:
                    s.sandboxes.append(made.sandbox_id)
            s.provider = made.provider or s.provider
            if made.recovery:
                s.recoveries += 1
        elif (taken := journal.snapshot_taken(row)) is not None:
            s.snapshots[taken] = None
        elif (gone := journal.snapshot_deleted(row)) is not None:
            s.snapshots.pop(gone, None)
        elif row.kind == journal.DESTROY:
            if journal.finalized(row):
                kept = journal.retained(row)
                s.state, s.sandbox_id, s.retained = "finalized", None, kept.snapshot_id if kept else None
            elif journal.detached(row):
                s.state, s.sandbox_id = "detached", None
            elif journal.destroyed(row) == s.sandbox_id:
                s.state = _AFTER_DESTROY.get(journal.reason(row) or "", "destroyed")
                s.sandbox_id = None
