"""What a Sandbox's call journal says (its calls session's state, what its sandboxes hold, the calls started and
never answered), folded row by row as the journal grows instead of read again from its first row for every call.

Why: a call read the whole journal five times (its journaled answer, its place, the rewound calls, the session's
state, what the live sandbox holds), so a call's own work grew with the session: 300 calls in, it cost more than
the call (benchmarks/session_calls.py; the profile in docs/benchmarks.md). The journal's rows only ever grow at
their end while a runtime has them (``RunRuntime.rows``: commits append), so what was folded stays true; a
runtime opened again (a new hold, a replacement) has another list of rows and is folded from its first row.
"""

from __future__ import annotations

from collections.abc import Sequence

from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.kube.sandbox.view import CALLS_SESSION
from durable_sandbox.sandboxes.holdings import Holdings
from durable_sandbox.sandboxes.state import SessionState

__all__ = ["DerivedJournal"]


class DerivedJournal:
    """The calls session of one call journal, as of the rows last given (see the module's docstring)."""

    def __init__(self) -> None:
        self._rows: Sequence[OperationRecord] | None = None
        self._folded = 0
        self._state = SessionState(CALLS_SESSION)
        self._holdings = Holdings()
        self._started: set[str] = set()  # call op ids whose latest record is ``started``

    def _catch_up(self, rows: Sequence[OperationRecord]) -> None:
        if rows is not self._rows or len(rows) < self._folded:  # another runtime's rows: from the first row
            self._rows, self._folded = rows, 0
            self._state, self._holdings, self._started = SessionState(CALLS_SESSION), Holdings(), set()
        for r in rows[self._folded:]:
            self._state.fold(r)
            self._holdings.fold(r, CALLS_SESSION)
            if r.kind == OpKind.SANDBOX_CALL.value:
                (self._started.add if r.status == "started" else self._started.discard)(r.op_id)
        self._folded = len(rows)

    def view(self, rows: Sequence[OperationRecord]) -> SessionState:
        """The session's state as of ``rows``: to read, never to change (:meth:`state` gives one to change)."""
        self._catch_up(rows)
        return self._state

    def state(self, rows: Sequence[OperationRecord]) -> SessionState:
        """The session's state as of ``rows``, a copy of its own (``SessionState.derive(CALLS_SESSION, rows)``)."""
        return self.view(rows).copy()

    def holdings(self, rows: Sequence[OperationRecord]) -> Holdings:
        """What the session's sandboxes and snapshots hold as of ``rows`` (``holdings(rows, CALLS_SESSION)``):
        to read, never to change."""
        self._catch_up(rows)
        return self._holdings

    def interrupted(self, rows: Sequence[OperationRecord]) -> bool:
        """Whether a call of the session (not rewound) was started and never answered, as of ``rows``."""
        rewound = self.view(rows).rewound
        return any(op not in rewound for op in self._started)
