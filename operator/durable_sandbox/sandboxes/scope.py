"""One session's place in its run: the run it journals into, its id, its provider and what its journal says.

Every piece of a session (provisioning, replay, recovery, checkpoints, teardown) works through a scope and the pieces
it needs, never through a ``SandboxSession``, so each can be used on its own: a scope over any run's journal of
completed calls and a provider is enough for a ``Checkpointer`` and a ``Recoverer``
(``tests/unit/test_session_pieces.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine.records import ErrorInfo, OperationRecord, OpKind
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.providers.contract import SandboxProvider
from durable_sandbox.sandboxes.state import SessionState


@dataclass
class SessionScope:
    rt: RunRuntime
    sid: str
    provider: SandboxProvider
    state: SessionState  # derived from the journal at open, then kept in step with every record written
    generation: int = 0  # failed finalizations before this epoch (SessionState.reopen_for): names new snapshots

    @classmethod
    def open(cls, rt: RunRuntime, sid: str, provider: SandboxProvider, *,
             state: SessionState | None = None) -> SessionScope:
        """The scope of session ``sid`` as the run's journal says it is now (re-opened if its run is retried);
        ``state``: that state, derived already (a copy of its own: the scope changes it)."""
        state = state if state is not None else SessionState.derive(sid, rt.known_rows())
        return cls(rt, sid, provider, state, state.reopen_for(rt.epoch))

    def local(self, op_id: str) -> str:
        """A call's operation id as its caller gave it (``<session>/<id>`` -> ``<id>``)."""
        return op_id[len(self.sid) + 1 :]

    def lookup(self, op_id: str) -> OperationRecord | None:
        return self.rt.lookup(op_id)

    def done(self, op_id: str) -> bool:
        rec = self.rt.lookup(op_id)
        return rec is not None and rec.status == "completed"

    async def write(self, op_id: str, kind: OpKind, name: str, status: str, *, digest: str | None = None,
                    result: Any = None, meta: dict[str, Any] | None = None, error: ErrorInfo | None = None,
                    check_cancel: bool = False, defer: bool = False) -> None:
        """Journal one record of the session (the attempt of the record it follows); ``defer``: committed with the
        run's next write."""
        prev = self.rt.lookup(op_id)
        attempt = prev.attempt if prev is not None else 1
        record = OperationRecord(op_id, kind.value, name, status, attempt, digest, result, error=error, meta=meta,
                                 epoch=self.rt.epoch)
        if defer:
            self.rt.defer_completion(record)
        else:
            await self.rt.write(record, check_cancel=check_cancel)
