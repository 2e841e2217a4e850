"""What the journal says about one session: its live sandbox, checkpoints and completed calls (derived, never kept)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.providers.contract import SandboxHandle
from durable_sandbox.sandboxes import fork_journal, journal, rewind_journal


@dataclass
class Checkpoint:
    count: int  # completed calls the snapshot contains
    snapshot_id: str
    op_id: str
    # Another run's snapshot a fork was built from (sandboxes/fork_journal.py): restored from like one's own,
    # never deleted from the provider (its owner deletes it); letting it go is only journaled.
    borrowed: bool = False


@dataclass
class SessionState:
    """What the journal says about one session."""

    sid: str
    provider: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    handle: SandboxHandle | None = None
    newest: str | None = None  # the newest sandbox the session made (a recovery's replacement): its result names it
    pending_handles: list[SandboxHandle] = field(default_factory=list)  # made but not yet adopted
    checkpoints: list[Checkpoint] = field(default_factory=list)
    # index -> (op id, its result as journaled: the record's own dict, so a long session holds no copy of each)
    calls: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    next_index: int = 0  # after every call journaled (started included): where a new call goes
    # call op id -> what a replay does with it (journal.ON_REPLAY_*), as its started record said
    policies: dict[str, str] = field(default_factory=dict)
    recoveries: int = 0
    recovery_attempts: int = 0  # recoveries begun and finished either way: what the budget counts
    restores: int = 0
    finalized: bool = False
    retained: str | None = None
    # (epoch, succeeded) of every finalization, oldest first: a session finalized because its run
    # failed is re-opened when the run is retried (a later epoch); see reopen_for.
    finalizations: list[tuple[int, bool]] = field(default_factory=list)
    rewinds: int = 0  # rewinds of the session committed (sandboxes/rewind_journal.py)
    rewound: set[str] = field(default_factory=set)  # the op ids of the calls they rewound: never the session's again

    @property
    def completed(self) -> int:
        n = 0
        while n in self.calls:
            n += 1
        return n

    def took(self, index: int) -> None:
        """A call was journaled at ``index``: new calls go after it."""
        self.next_index = max(self.next_index, index + 1)

    @property
    def latest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def forget(self, sandbox_id: str | None) -> None:
        """Sandbox ``sandbox_id`` is gone (destroyed or let go): neither live nor pending any more."""
        if self.handle is not None and self.handle.id == sandbox_id:
            self.handle = None
        self.pending_handles = [h for h in self.pending_handles if h.id != sandbox_id]

    def adopt(self, handle: SandboxHandle) -> None:
        """``handle`` (a provision's or a restore's) is the session's live sandbox now."""
        self.handle, self.newest = handle, handle.id
        self.pending_handles = [h for h in self.pending_handles if h.id != handle.id]

    @classmethod
    def derive(cls, sid: str, rows: Sequence[OperationRecord]) -> SessionState:
        st = cls(sid)
        for r in rows:
            st.fold(r)
        return st

    def fold(self, r: OperationRecord) -> None:
        """One more journal row, in commit order (``derive`` is every row folded): a row of another session is
        ignored."""
        if r.op_id.startswith(self.sid + "/"):
            self._read(r)

    def copy(self) -> SessionState:
        """A copy whose changes leave this one as it is (the results in ``calls`` are shared: never changed)."""
        return replace(self, options=dict(self.options), pending_handles=list(self.pending_handles),
                       checkpoints=list(self.checkpoints), calls=dict(self.calls), policies=dict(self.policies),
                       finalizations=list(self.finalizations), rewound=set(self.rewound))

    def _read(self, r: OperationRecord) -> None:
        meta = r.meta or {}
        if (rewind := rewind_journal.rewind_of(r)) is not None:
            self._rewind(rewind)
            return
        if r.status == "started":
            if r.kind == OpKind.SANDBOX_PROVISION.value:
                self.provider = meta.get("provider", self.provider)
                self.options = meta.get("options", self.options)
            if r.kind == OpKind.SANDBOX_CALL.value:
                self.policies[r.op_id] = journal.on_replay(r)
            if meta.get("handle"):
                self.pending_handles.append(SandboxHandle.model_validate(meta["handle"]))
        elif journal.read_only(r):  # journaled at its completion only: never replayed
            self.policies[r.op_id] = journal.ON_REPLAY_SKIP
        index = journal.call_index(r)
        if index is not None:
            self.took(index)
        if r.kind == OpKind.SANDBOX_RESTORE.value and r.status == "failed":
            self.restores += 1
            self.recovery_attempts += meta.get(journal.META_REASON) == journal.REASON_RECOVERY
        if r.status == "completed":
            self._read_completed(r, meta)

    def _read_completed(self, r: OperationRecord, meta: dict[str, Any]) -> None:
        if r.kind in (OpKind.SANDBOX_PROVISION.value, OpKind.SANDBOX_RESTORE.value):
            self.adopt(SandboxHandle.model_validate(r.result))
            if r.kind == OpKind.SANDBOX_RESTORE.value:
                self.restores += 1
                if journal.recovered(r):
                    self.recoveries += 1
                    self.recovery_attempts += 1
        elif r.kind == OpKind.SANDBOX_DESTROY.value:
            self.forget(meta.get(journal.META_SANDBOX_ID))
        elif r.kind == OpKind.SANDBOX_SNAPSHOT.value:
            self.checkpoints.append(Checkpoint(int(meta["count"]), r.result["snapshotId"], r.op_id,
                                               bool(meta.get(fork_journal.BORROWED))))
        elif r.kind == OpKind.SANDBOX_SNAPSHOT_DELETE.value:
            self.checkpoints = [c for c in self.checkpoints if c.snapshot_id != journal.deletion_of(r)]
        elif r.kind == OpKind.SANDBOX_CALL.value:
            self.calls[int(meta["index"])] = (r.op_id, r.result)
        if journal.finalized(r):
            self.finalized = True
            kept = journal.retained(r)
            self.retained = kept.snapshot_id if kept else None
            self.finalizations.append((r.epoch, bool(meta.get(journal.META_SUCCEEDED, True))))

    def _rewind(self, rewind: rewind_journal.Rewind) -> None:
        """The calls from index ``to_call`` on are no longer the session's; the next call goes at ``to_call``."""
        self.calls = {i: done for i, done in self.calls.items() if i < rewind.to_call}
        self.next_index = rewind.to_call
        self.checkpoints = [c for c in self.checkpoints if c.count <= rewind.to_call]
        self.rewound.update(rewind.rewound)
        self.rewinds += 1

    def reopen_for(self, epoch: int) -> int:
        """Re-open a session finalized because its run failed, when the run is retried (``epoch`` later
        than the failure's); returns the session's generation: how many failed finalizations precede
        this epoch. Nothing of the failed attempt's sandbox remains (finalization destroyed it and
        deleted its snapshots), so the next call rebuilds the workspace: a fresh sandbox, every
        completed call replayed in order with its outcome checked. A run that is never retried leaks
        nothing; one that is retried continues exactly as if it had not failed."""
        generation = sum(1 for e, ok in self.finalizations if not ok and e < epoch)
        if self.finalized and self.finalizations and not self.finalizations[-1][1] and self.finalizations[-1][0] < epoch:
            self.finalized = False
            self.retained = None
        return generation
