"""The sandbox sessions' journal records: how they are named, which meta keys they carry, what each means.

The session writes them (``sandboxes/session.py`` and its pieces: ``provisioning.py``, ``checkpoints.py``,
``recovery.py``, ``replay_policy.py``, ``teardown.py``); everyone who reads them reads them through this module:
the engine through the :class:`SandboxJournal` reader it is given (``engine/extensions.py``: the engine
imports nothing of sandboxes), ``dsb inspect``/``history``/``logs`` (``cli/render.py``, ``cli/progress.py``),
the operator's status, Events and finalizer (``kube/reporting/status.py``, ``kube/reporting/events.py``,
``kube/workflow/cleanup.py``).

Op ids of session ``s`` (every id is scoped by its session, so a caller's operation id never collides with
a step's), with their kind:

====================================  ===========================  ==========================================
``s/provision``                       ``sandbox.provision``        the session's first sandbox
``s/<operationId>``                   ``sandbox.call``             a tool call (the caller's id or ``dsv1_...``)
``s/snapshot/<n>[~g][~rk]``           ``sandbox.snapshot``         a checkpoint after ``n`` completed calls
``s/snapshot/<n>[~g]/delete``         ``sandbox.snapshot_delete``  that checkpoint deleted once superseded
``s/inject_loss/<n>``                 ``sandbox.inject_loss``      loss injected after ``n`` calls (testing)
``s/restore/<k>``                     ``sandbox.restore``          the ``k``-th sandbox made again
``s/destroy/<sandbox id>``            ``sandbox.destroy``          a sandbox destroyed (or detached)
``s/finalize[~g]``                    ``sandbox.destroy``          the session's end (meta ``finalized``)
``replay:s/<operationId>``            ``callback``                 a replay of an ``ask`` call, asked (``onReplay``)
``s/rewind/<k>``                      ``sandbox.restore``          the session's ``k``-th rewind (name ``rewind``;
                                                                   sandboxes/rewind_journal.py)
``rebuild/<sandbox id>``              ``sandbox.restore``          a Sandbox's session calls replayed into its live
                                                                   sandbox (sessions/rebuild.py; :func:`rebuilt`)
====================================  ===========================  ==========================================

``~g`` is the generation of a session re-opened after its run failed and was retried (the failed
attempt's ids are taken); ``~rk`` the rewinds of a Sandbox's session before the checkpoint (a rewound one's id is taken). Meta keys: see the ``META_*`` names; restore and destroy reasons: ``REASON_*``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.providers.contract import RUNTIME_CLASS_KEY

__all__ = [
    "META_FINALIZED",
    "META_REASON",
    "META_RETAINED",
    "META_SANDBOX_ID",
    "META_SNAPSHOT_ID",
    "REASON_LOST",
    "REASON_RECOVERY",
    "REBUILD",
    "Provisioned",
    "Rebuilt",
    "Retained",
    "SandboxJournal",
    "Tally",
    "call_index",
    "call_target",
    "count",
    "delete_id",
    "deletion_of",
    "destroy_id",
    "detached",
    "finalize_id",
    "finalized",
    "inject_loss_id",
    "live_snapshots",
    "lost_sandbox",
    "pinned_provider",
    "provision_id",
    "provisioned",
    "read_only",
    "reason",
    "rebuilt",
    "recovered",
    "recovery_count",
    "recovery_started",
    "reserved_operation_id",
    "restore_id",
    "retained",
    "session_of",
    "sessions_in",
    "snapshot_deleted",
    "snapshot_id",
    "snapshot_taken",
]

PROVISION, CALL, SNAPSHOT, SNAPSHOT_DELETE = (OpKind.SANDBOX_PROVISION.value, OpKind.SANDBOX_CALL.value,
                                              OpKind.SANDBOX_SNAPSHOT.value, OpKind.SANDBOX_SNAPSHOT_DELETE.value)
INJECT_LOSS, RESTORE, DESTROY = (OpKind.SANDBOX_INJECT_LOSS.value, OpKind.SANDBOX_RESTORE.value,
                                 OpKind.SANDBOX_DESTROY.value)
SANDBOX_KINDS = frozenset({PROVISION, CALL, SNAPSHOT, SNAPSHOT_DELETE, INJECT_LOSS, RESTORE, DESTROY})

# Meta keys.
META_PROVIDER = "provider"  # provision (started): the provider, pinned for the whole run
META_OPTIONS = "options"  # provision (started): the session's options (lease, attach, ...)
META_HANDLE = "handle"  # provision/restore (started): a sandbox made, not yet recorded as the session's
META_INDEX = "index"  # call: its 0-based position in the session
META_REQUEST = "request"  # snapshot: the operation id of the request that asked for it (a Sandbox's call API)
META_OPERATION_ID = "operationId"  # call: the caller's operation id; snapshot: the provider's
META_CALL = "call"  # call (started; a read-only call's completed): {type, args}, for replay and display
META_READ_ONLY = "readOnly"  # call (completed): it cannot change the workspace (no started record, never replayed)
META_COUNT = "count"  # snapshot, inject_loss: completed calls at that point
META_SNAPSHOT_ID = "snapshotId"  # snapshot_delete, restore: the snapshot concerned
META_SANDBOX_ID = "sandboxId"  # call, destroy, inject_loss: the sandbox concerned
META_REASON = "reason"  # restore, destroy: why (REASON_*)
META_REPLAYED = "replayed"  # restore (completed): the calls replayed into the new sandbox
META_DETACHED = "detached"  # destroy: an attached Sandbox resource's sandbox let go, not destroyed
META_FINALIZED = "finalized"  # finalize: the session has ended (every sandbox and snapshot gone)
META_RETAINED = "retained"  # finalize: the snapshot kept for the caller (retain_latest_snapshot), if any
META_SUCCEEDED = "succeeded"  # finalize: whether the block succeeded (a failed one is re-opened on retry)
META_ON_REPLAY = "onReplay"  # call (started): what a replay of it does (ON_REPLAY_*); absent: rerun
META_SKIPPED = "skipped"  # restore (completed): the calls not replayed (skip, or asked and answered skip)
META_ASKED = "asked"  # restore (completed): {call op id: the answer} of every ask call of the replay

# What a replay does with a call (a tool call's onReplay, a code-first call's on_replay=), journaled with the call.
ON_REPLAY_RERUN = "rerun"  # execute it again into the replacement, outcome checked (the default)
ON_REPLAY_SKIP = "skip"  # do not execute it again: its journaled result stands (its workspace changes are missing)
ON_REPLAY_ASK = "ask"  # wait on the callback ``replay:<call op id>``, answered rerun or skip
ON_REPLAY = (ON_REPLAY_RERUN, ON_REPLAY_SKIP, ON_REPLAY_ASK)
ANSWERS = (ON_REPLAY_RERUN, ON_REPLAY_SKIP)  # what an ask callback may be answered
ASK_PREFIX = "replay:"

# Reasons (META_REASON).
# A Sandbox's own session (sessions/rebuild.py): op ids ``rebuild/<sandbox id>``, outside its calls session.
REBUILD = "rebuild"
REASON_RECOVERY = "recovery"  # restore: after the sandbox was lost
REASON_RESUME = "resume"  # restore: a re-opened session rebuilt from the journal
REASON_LOST = "lost"  # destroy: the lost sandbox, before recovery
REASON_FINALIZE = "finalize"
REASON_HIBERNATE = "hibernate"
REASON_ABANDONED = "abandoned"
REASON_REJECTED = "rejected"


# ------------------------------------------------------------------ op ids


def _generation(generation: int) -> str:
    return f"~{generation}" if generation else ""


def provision_id(sid: str) -> str:
    return f"{sid}/provision"


def call_id(sid: str, operation_id: str) -> str:
    return f"{sid}/{operation_id}"


def snapshot_id(sid: str, count: int, generation: int = 0, rewinds: int = 0) -> str:
    return f"{sid}/snapshot/{count}{_generation(generation)}{f'~r{rewinds}' if rewinds else ''}"


def delete_id(snapshot_op_id: str) -> str:
    return f"{snapshot_op_id}/delete"


def inject_loss_id(sid: str, count: int) -> str:
    return f"{sid}/inject_loss/{count}"


def restore_id(sid: str, number: int) -> str:
    return f"{sid}/restore/{number}"


def destroy_id(sid: str, sandbox_id: str) -> str:
    return f"{sid}/destroy/{sandbox_id}"


def finalize_id(sid: str, generation: int = 0) -> str:
    return f"{sid}/finalize{_generation(generation)}"


def ask_id(call_op_id: str) -> str:
    """The callback a replay of an ``ask`` call waits on: ``replay:<the call's op id>`` (e.g.
    ``replay:sandbox/push``), stable across executions, the key of ``dsb signal`` and ``spec.signals``."""
    return ASK_PREFIX + call_op_id


def asks_of(sid: str, op_ids: Iterable[str]) -> list[str]:
    """The ask callbacks of session ``sid`` among ``op_ids``."""
    prefix = ASK_PREFIX + sid + "/"
    return [op for op in op_ids if op.startswith(prefix)]


def answer_problem(callback_id: str, value: object) -> str | None:
    """Why ``value`` cannot answer ``callback_id`` (None: it can, or it is not a replay callback). Said by
    `dsb signal` and the Workflow models before a signal is stored, and by the session if one gets through."""
    if not callback_id.startswith(ASK_PREFIX) or value in ANSWERS:
        return None
    return (f"{callback_id} is a replay callback: answer it \"rerun\" (execute the call again into the rebuilt "
            f"sandbox) or \"skip\" (keep its journaled result), as a JSON string, not {json.dumps(value)}")


def check_on_replay(value: str, where: str) -> str:
    if value not in ON_REPLAY:
        raise ValueError(f"{where}: on_replay must be one of {', '.join(ON_REPLAY)}, not {value!r}")
    return value


RESERVED_HEADS = frozenset({"provision", "finalize", "snapshot", "restore", "destroy", "inject_loss"})


def reserved_operation_id(operation_id: str) -> bool:
    """Operation ids that would collide with the session's own ids (``<session>/provision``...)."""
    return operation_id.split("/", 1)[0] in RESERVED_HEADS


# How many trailing parts of a lifecycle record's op id follow its session's id, by kind.
_SESSION_TAIL: Final[Mapping[str, int]] = {PROVISION: 1, SNAPSHOT: 2, SNAPSHOT_DELETE: 3, RESTORE: 2, INJECT_LOSS: 2}


def session_of(row: OperationRecord) -> str | None:
    """The session (``ctx.sandbox`` id, with its scope) a sandbox record belongs to; None for other records. A
    call's is its op id without the operation id its meta records (session and operation ids may hold ``/``)."""
    if row.kind == CALL:
        operation_id = _meta(row).get(META_OPERATION_ID)
        if isinstance(operation_id, str) and row.op_id.endswith("/" + operation_id):
            return row.op_id[: -len(operation_id) - 1]
        return row.op_id.rsplit("/", 1)[0] if "/" in row.op_id else None
    if row.kind == DESTROY:  # s/destroy/<sandbox id>, or the closing s/finalize[~g]
        parts = row.op_id.rsplit("/", 2)
        tail = 2 if len(parts) == 3 and parts[1] == "destroy" and not finalized(row) else 1
    else:
        tail = _SESSION_TAIL.get(row.kind, 0)
    if not tail or row.op_id.count("/") < tail:
        return None
    return row.op_id.rsplit("/", tail)[0]


def _session(row: OperationRecord) -> str:
    """The session of a provision, restore or finalize record. (Session ids may contain ``/``: a parallel
    branch's scope; so may a call's operation id: a call's session is not parsed from its id.)"""
    if row.kind == RESTORE:
        return row.op_id.rsplit("/", 2)[0]  # s/restore/<k>
    return row.op_id.rsplit("/", 1)[0]  # s/provision, s/finalize[~g]


def sessions_in(rows: Iterable[OperationRecord]) -> list[str]:
    """Ids of every session a journal mentions (from their provision records), in order."""
    seen: dict[str, None] = {}
    for r in rows:
        if r.kind == PROVISION and r.op_id.endswith("/provision"):
            seen[r.op_id[: -len("/provision")]] = None
    return list(seen)


# ------------------------------------------------------------------ what a record means


def _meta(row: OperationRecord) -> Mapping[str, Any]:
    return row.meta or {}


def _completed(row: OperationRecord, kind: str) -> bool:
    return row.kind == kind and row.status == "completed"


@dataclass(frozen=True)
class Provisioned:
    """A sandbox a session made (provisioned, or restored): where it is."""

    session: str
    provider: str | None
    sandbox_id: str | None
    recovery: bool  # made again after the session's sandbox was lost
    runtime_class: str | None = None  # the RuntimeClass it runs under, when its provider says (gVisor, Kata...)


def provisioned(row: OperationRecord) -> Provisioned | None:
    """The sandbox a completed provision or restore record made."""
    if row.status != "completed" or row.kind not in (PROVISION, RESTORE) or not isinstance(row.result, dict):
        return None
    metadata = row.result.get("metadata")
    runtime_class = metadata.get(RUNTIME_CLASS_KEY) if isinstance(metadata, dict) else None
    return Provisioned(session=_session(row), provider=row.result.get("provider"), sandbox_id=row.result.get("id"),
                       recovery=row.kind == RESTORE and _meta(row).get(META_REASON) == REASON_RECOVERY,
                       runtime_class=runtime_class if isinstance(runtime_class, str) else None)


def snapshot_taken(row: OperationRecord) -> str | None:
    """The snapshot id a completed snapshot record took."""
    if _completed(row, SNAPSHOT) and isinstance(row.result, dict) and row.result.get("snapshotId"):
        return str(row.result["snapshotId"])
    return None


def deletion_of(row: OperationRecord) -> str | None:
    """The snapshot id a snapshot deletion record is about (started: being deleted; completed: deleted)."""
    value = _meta(row).get(META_SNAPSHOT_ID) if row.kind == SNAPSHOT_DELETE else None
    return str(value) if value else None


def snapshot_deleted(row: OperationRecord) -> str | None:
    """The snapshot id a completed snapshot deletion deleted."""
    return deletion_of(row) if row.status == "completed" else None


def recovery_started(row: OperationRecord) -> bool:
    """The session began to recover from a lost sandbox (a loss injected, or a recovery restore begun)."""
    return row.kind == INJECT_LOSS or (row.kind == RESTORE and row.status == "started"
                                       and _meta(row).get(META_REASON) == REASON_RECOVERY)


def recovered(row: OperationRecord) -> bool:
    """A recovery finished: the lost sandbox was made again (and every later call replayed)."""
    return _completed(row, RESTORE) and _meta(row).get(META_REASON) == REASON_RECOVERY


def replayed(row: OperationRecord) -> list[str]:
    """The calls a restore executed again into its sandbox."""
    return list(_meta(row).get(META_REPLAYED) or [])


def skipped(row: OperationRecord) -> list[str]:
    """The calls a restore did not execute again (their journaled result stands)."""
    return list(_meta(row).get(META_SKIPPED) or [])


def asked(row: OperationRecord) -> dict[str, str]:
    """{call op id: answer} of the calls a restore asked about before replaying (each is also replayed or skipped)."""
    value = _meta(row).get(META_ASKED)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def on_replay(row: OperationRecord) -> str:
    """What a replay does with a call, as journaled when it first ran (absent: rerun; a read-only call: skip)."""
    if read_only(row):
        return ON_REPLAY_SKIP
    value = _meta(row).get(META_ON_REPLAY) if row.kind == CALL else None
    return str(value) if value in ON_REPLAY else ON_REPLAY_RERUN


def read_only(row: OperationRecord) -> bool:
    """A call journaled as one that cannot change the workspace (a session's ``read_file`` or ``list``): only its
    completion is journaled, and rebuilding a sandbox never runs it again (there is nothing of it to rebuild)."""
    return row.kind == CALL and bool(_meta(row).get(META_READ_ONLY))


_LISTED = 5  # op ids listed per kind in a summary; the rest are counted


def _listed(ops: list[str]) -> str:
    shown = ", ".join(ops[:_LISTED])
    return shown + (f" and {len(ops) - _LISTED} more" if len(ops) > _LISTED else "")


def replay_summary(row: OperationRecord) -> str:
    """What a completed restore did with the calls since its snapshot, by op id: ``2 call(s) replayed
    (sandbox/a, sandbox/b), 1 skipped (sandbox/push), 1 asked (sandbox/notify: rerun)`` (the Recovered
    Event, the lifecycle log, `dsb inspect`)."""
    done, passed, answers = replayed(row), skipped(row), asked(row)
    parts = [f"{len(done)} call(s) replayed" + (f" ({_listed(done)})" if done else "")]
    if passed:
        parts.append(f"{len(passed)} skipped ({_listed(passed)})")
    if answers:
        parts.append(f"{len(answers)} asked ({_listed([f'{op}: {a}' for op, a in answers.items()])})")
    return ", ".join(parts)


@dataclass(frozen=True)
class Rebuilt:
    """What a Sandbox's session rebuild record says (sessions/rebuild.py writes it: a live sandbox brought to hold
    every earlier completed session call, the missing ones replayed into it in order)."""

    sandbox: str  # the sandbox brought up to date
    held: int  # the session calls it held before
    count: int  # the calls it holds after
    replayed: list[str]  # the operation ids (as callers gave them) executed again into it (completed record)


def rebuilt(row: OperationRecord) -> Rebuilt | None:
    """The rebuild a ``rebuild/<sandbox id>`` record is about (None for any other record)."""
    if row.kind != RESTORE or not row.op_id.startswith(REBUILD + "/"):
        return None
    meta = _meta(row)
    done = row.result.get("replayed") if isinstance(row.result, dict) else None
    return Rebuilt(sandbox=str(meta.get("sandbox") or row.op_id[len(REBUILD) + 1:]), held=int(meta.get("from") or 0),
                   count=int(meta.get("count") or 0),
                   replayed=[op for op in done or [] if isinstance(op, str)])


def restored_from(row: OperationRecord) -> str | None:
    """The snapshot a restore started from (None: a fresh sandbox)."""
    value = _meta(row).get(META_SNAPSHOT_ID) if row.kind == RESTORE else None
    return str(value) if value else None


def lost_sandbox(row: OperationRecord) -> str | None:
    """The id of the sandbox a completed destroy record says was lost (injected or real)."""
    if _completed(row, DESTROY) and _meta(row).get(META_REASON) == REASON_LOST:
        return str(_meta(row).get(META_SANDBOX_ID))
    return None


def finalized(row: OperationRecord) -> bool:
    """The session's closing record: its sandboxes destroyed and its snapshots deleted (but one retained)."""
    return row.kind == DESTROY and bool(_meta(row).get(META_FINALIZED))


@dataclass(frozen=True)
class Retained:
    """The snapshot a finalized session kept for the caller (retain_latest_snapshot, on success)."""

    session: str
    snapshot_id: str


def retained(row: OperationRecord) -> Retained | None:
    value = _meta(row).get(META_RETAINED) if _completed(row, DESTROY) and finalized(row) else None
    return Retained(_session(row), str(value)) if value else None


def pinned_provider(row: OperationRecord) -> tuple[str, str] | None:
    """(session, provider) of a provision record: the provider is pinned for the whole run, recoveries too."""
    provider = _meta(row).get(META_PROVIDER) if row.kind == PROVISION else None
    return (_session(row), str(provider)) if provider else None


def reason(row: OperationRecord) -> str | None:
    """Why a restore or a destroy happened (``REASON_*``)."""
    value = _meta(row).get(META_REASON) if row.kind in (RESTORE, DESTROY) else None
    return str(value) if value else None


def detached(row: OperationRecord) -> bool:
    """A destroy record that only let go of an attached Sandbox resource's sandbox (never destroyed here)."""
    return row.kind == DESTROY and bool(_meta(row).get(META_DETACHED))


def count(row: OperationRecord) -> int | None:
    """The completed calls at a snapshot or a loss injection."""
    value = _meta(row).get(META_COUNT) if row.kind in (SNAPSHOT, INJECT_LOSS) else None
    return value if isinstance(value, int) else None


def destroyed(row: OperationRecord) -> str | None:
    """The sandbox id a destroy record names (not the closing record)."""
    value = _meta(row).get(META_SANDBOX_ID) if row.kind == DESTROY and not finalized(row) else None
    return str(value) if value else None


def call_index(row: OperationRecord) -> int | None:
    index = _meta(row).get(META_INDEX) if row.kind == CALL else None
    return index if isinstance(index, int) else None


def call_target(row: OperationRecord) -> str | None:
    """What a sandbox call works on: a shell call's command, a file call's path (from its started record)."""
    call = _meta(row).get(META_CALL) if row.kind == CALL else None
    if not isinstance(call, dict) or not isinstance(call.get("args"), dict):
        return None
    target = call["args"].get("command" if call.get("type") == "shell" else "path")
    return target if isinstance(target, str) else None


def call_outcome(row: OperationRecord) -> dict[str, Any] | None:
    """A completed call's exit code and output, as the journal keeps them (capped per stream)."""
    if _completed(row, CALL) and isinstance(row.result, dict) and "exitCode" in row.result:
        return row.result
    return None


def failed_call_outcome(row: OperationRecord) -> dict[str, Any] | None:
    """The exit code and output of a call that failed the run under its failurePolicy (kept in the failed
    record's meta: a failed record has an error, not a result)."""
    outcome = _meta(row).get("outcome") if row.kind == CALL and row.status == "failed" else None
    return outcome if isinstance(outcome, dict) and "exitCode" in outcome else None


@dataclass
class Tally:
    """What a run's sandbox records add up to, folded row by row in commit order (so it can be fed
    incrementally): live snapshots oldest first, recoveries, and calls (completed and reached, per session)."""

    snapshots: dict[str, None] = field(default_factory=dict)
    recoveries: int = 0
    calls_done: set[tuple[str, int]] = field(default_factory=set)
    calls_seen: set[tuple[str, int]] = field(default_factory=set)

    def feed(self, rows: Iterable[OperationRecord]) -> Tally:
        for row in rows:
            self.fold(row)
        return self

    def fold(self, row: OperationRecord) -> None:
        kind = row.kind
        if kind not in SANDBOX_KINDS:  # the kind first: O(rows) over a long journal
            return
        if kind == CALL:
            index = call_index(row)
            if index is not None:
                key = (session_of(row) or "", index)
                self.calls_seen.add(key)
                if row.status == "completed":
                    self.calls_done.add(key)
        elif (taken := snapshot_taken(row)) is not None:
            self.snapshots[taken] = None
        elif (gone := snapshot_deleted(row)) is not None:
            self.snapshots.pop(gone, None)
        elif recovered(row):
            self.recoveries += 1

    @property
    def live_snapshots(self) -> list[str]:
        return list(self.snapshots)

    @property
    def latest_snapshot(self) -> str | None:
        return next(reversed(self.snapshots), None) if self.snapshots else None

    def calls(self, total: int | None) -> tuple[int, int]:
        """(completed, total): ``total`` when the run's input gives it (a manifest's toolCalls), else the calls
        reached so far."""
        return len(self.calls_done), total if total is not None else len(self.calls_seen)


def live_snapshots(rows: Iterable[OperationRecord]) -> list[str]:
    """Snapshots recorded as taken and not (yet) recorded as deleted, oldest first."""
    return Tally().feed(rows).live_snapshots


def recovery_count(rows: Iterable[OperationRecord]) -> int:
    return Tally().feed(rows).recoveries


# ------------------------------------------------------------------ the engine's reader


_EVENTS: Final[Mapping[str, str]] = {
    PROVISION: "sandbox.provisioned",
    SNAPSHOT: "sandbox.snapshot",
    SNAPSHOT_DELETE: "sandbox.snapshot_deleted",
    INJECT_LOSS: "sandbox.loss_injected",
    DESTROY: "sandbox.destroyed",
}


class SandboxJournal:
    """How the engine reads the sessions' records (``engine.extensions.JournalReader``): the target and
    outcome of a call, the event a record is in `Engine.stream`, a run's live snapshots and recoveries."""

    def target(self, row: OperationRecord) -> str | None:
        return call_target(row)

    def event(self, row: OperationRecord) -> dict[str, Any] | None:
        if row.kind == CALL:
            out: dict[str, Any] = {"type": f"call.{row.status}"}
            outcome = call_outcome(row) or failed_call_outcome(row)  # the output of a failing call matters most
            if outcome is not None:
                out["exitCode"] = outcome.get("exitCode")
                out.update({stream: outcome[stream] for stream in ("stdout", "stderr") if outcome.get(stream)})
            return out
        if row.kind == RESTORE and row.status == "started" and isinstance(_meta(row).get(META_HANDLE), dict):
            # The restore's second started record: its replacement made, not yet adopted (not a second start).
            return {"type": "sandbox.restore.provisioned", "sandboxId": _meta(row)[META_HANDLE].get("id")}
        if row.kind not in SANDBOX_KINDS or row.status != "completed":
            return None
        if row.kind == RESTORE:
            return {"type": "sandbox.recovered" if recovered(row) else "sandbox.restored"}
        if finalized(row):
            return {"type": "sandbox.finalized"}  # the session's closing record, not a second destroy
        return {"type": _EVENTS[row.kind]}

    def snapshots(self, rows: Iterable[OperationRecord]) -> list[str]:
        return live_snapshots(rows)

    def recoveries(self, rows: Iterable[OperationRecord]) -> int:
        return recovery_count(rows)
