"""Rewinding a Sandbox's session in place: ``rewind(to_call=N)`` keeps its first ``N`` calls and undoes the rest.

Order of effects (each committed before the next; sandboxes/rewind_journal.py says what the record means):

1. ``calls/rewind/<k>`` journaled ``started``, naming ``N`` and the calls it rewinds (completed ones, and any
   call started and never answered: it may have run, and it is after ``N`` too);
2. every checkpoint of the session holding more than ``N`` calls deleted (journaled as a superseded one is);
3. ``calls/rewind/<k>`` journaled ``completed``: from here on the rewind has happened. A crash before it
   leaves a rewind that did not happen (its deleted checkpoints only make a later rebuild replay more);
4. the live sandbox, which holds rewound calls, is stale: destroyed and replaced by the Sandbox's controller
   from the newest snapshot at or before ``N`` (or fresh), and the calls up to ``N`` replayed into it with the
   outcome check (``rebuild.py``, as after a loss). A crash here is finished by the next call, which finds the
   same stale sandbox. The rewind is answered once the workspace holds exactly the calls kept.

Rewinding to the number of calls completed rewinds nothing and writes nothing. The next call goes at index
``N`` (the session's call ``N+1``) under an operation id of its own: a rewound call's id is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_sandbox.engine import faults
from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.kube.sandbox.view import CALLS_SESSION
from durable_sandbox.providers.contract import SandboxProvider
from durable_sandbox.sandboxes import fork_journal, journal, retries, rewind_journal
from durable_sandbox.sandboxes.services import SandboxServices
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.rebuild import REBUILD

__all__ = ["Rewound", "commit_rewind", "rebuilt_calls"]


@dataclass(frozen=True)
class Rewound:
    to_call: int  # the calls kept (the session's first ``to_call``)
    rewound: tuple[str, ...]  # the operation ids of the calls rewound, in order
    sandbox_id: str  # the live sandbox now (holding exactly the calls kept)
    replayed: tuple[str, ...]  # the calls replayed into it (after the snapshot it was restored from)


async def commit_rewind(rt: RunRuntime, where: str, provider: SandboxProvider, to_call: int) -> tuple[str, ...]:
    """Steps 1-3 of the module's docstring; the operation ids rewound (none: nothing after ``to_call``)."""
    state = SessionState.derive(CALLS_SESSION, rt.rows)
    completed = state.completed
    if not 0 <= to_call <= completed:
        raise CallRefused(409, f"toCall {to_call} is not a point of this session: it has completed {completed} "
                          "calls", where=f"{where}, toCall", do=f"give toCall between 0 and {completed}")
    ops = [op for index, (op, _) in sorted(state.calls.items()) if index >= to_call]
    ops += [r.op_id for r in rt.latest.values() if r.kind == OpKind.SANDBOX_CALL.value and r.status == "started"
            and journal.session_of(r) == CALLS_SESSION and r.op_id not in state.rewound and r.op_id not in ops]
    if not ops:
        return ()
    op_id = rewind_journal.rewind_id(CALLS_SESSION, state.rewinds + 1)
    meta = {rewind_journal.META_TO: to_call, rewind_journal.META_REWOUND: ops}
    await rt.write(OperationRecord(op_id, OpKind.SANDBOX_RESTORE.value, rewind_journal.REWIND, "started",
                                   meta=meta, epoch=rt.epoch))
    for checkpoint in [c for c in state.checkpoints if c.count > to_call]:
        await _delete(rt, provider, checkpoint.op_id, checkpoint.snapshot_id, checkpoint.borrowed)
    faults.reach(f"before-commit:{op_id}")
    await rt.write(OperationRecord(op_id, OpKind.SANDBOX_RESTORE.value, rewind_journal.REWIND, "completed",
                                   result={rewind_journal.META_TO: to_call, rewind_journal.META_REWOUND: ops},
                                   meta={**meta, rewind_journal.META_SANDBOX: _live(state)}, epoch=rt.epoch))
    faults.reach(f"after-commit:{op_id}")
    return tuple(op[len(CALLS_SESSION) + 1:] for op in ops)


def rebuilt_calls(rt: RunRuntime, sandbox_id: str) -> list[str]:
    """The calls replayed into ``sandbox_id`` by its rebuild (none if it needed none)."""
    found = rt.latest.get(f"{REBUILD}/{sandbox_id}")
    if found is None or found.status != "completed":
        return []
    return [str(op) for op in (found.result or {}).get("replayed") or []]


def _live(state: SessionState) -> str | None:
    return state.handle.id if state.handle is not None else None


async def _delete(rt: RunRuntime, provider: SandboxProvider, snapshot_op: str, snapshot_id: str, borrowed: bool) -> None:
    """A checkpoint holding rewound calls deleted, journaled like a superseded one (checkpoints.py)."""
    op_id = journal.delete_id(snapshot_op)
    meta = {journal.META_SNAPSHOT_ID: snapshot_id}
    await rt.write(OperationRecord(op_id, OpKind.SANDBOX_SNAPSHOT_DELETE.value, "delete", "started", meta=meta,
                                   epoch=rt.epoch))
    await retries.cleanup(f"delete snapshot {snapshot_id}",
                          lambda: fork_journal.delete_own(provider, snapshot_id, borrowed),
                          SandboxServices.of(rt).cleanup_attempts)
    await rt.write(OperationRecord(op_id, OpKind.SANDBOX_SNAPSHOT_DELETE.value, "delete", "completed", meta=meta,
                                   epoch=rt.epoch))
