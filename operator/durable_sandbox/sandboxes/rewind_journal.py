"""A rewind of a Sandbox's session in the journal: the record that says "the calls after N are undone".

``rewind(to_call=N)`` (sessions/rewind.py) keeps the session's first ``N`` completed calls and rewinds the rest.
Nothing is deleted from the history: one record, ``<session>/rewind/<k>`` (the session's ``k``-th rewind, kind
``sandbox.restore``, name ``rewind``), is committed with the op ids it rewinds, and every reader that derives the
session from the journal (``state.py``, ``sessions/rebuild.py``) applies it in commit order:

- calls at index ``N`` and after, committed before it, are no longer the session's (their records stay, marked
  rewound in the record's meta); the next call goes at index ``N``;
- a rewound call's operation id is never used again (a retry of it is refused, so an answer can never come
  from a rewound call);
- checkpoints holding more than ``N`` calls were deleted before the record was committed (journaled as any
  superseded checkpoint), and checkpoints taken after it get ids of their own (``~r<k>``);
- every sandbox that held a rewound call is stale: it is never used again, but destroyed and replaced by one
  rebuilt from the newest checkpoint at or before ``N`` (or fresh) with the calls up to ``N`` replayed.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_sandbox.engine.records import OperationRecord, OpKind

__all__ = ["META_REWOUND", "META_TO", "REWIND", "Rewind", "rewind_id", "rewind_of"]

REWIND = "rewind"  # the record's name (its kind is sandbox.restore: the workspace goes back to a point)
META_TO = "toCall"  # the calls kept: indexes 0 .. toCall-1
META_REWOUND = "rewound"  # the op ids of the calls rewound (completed or interrupted), in index order
META_SANDBOX = "sandboxId"  # the live sandbox when the rewind was committed (stale from then on)


@dataclass(frozen=True)
class Rewind:
    to_call: int
    rewound: tuple[str, ...]
    sandbox_id: str | None


def rewind_id(sid: str, number: int) -> str:
    """The ``number``-th rewind of session ``sid`` (1-based)."""
    return f"{sid}/{REWIND}/{number}"


def rewind_of(row: OperationRecord) -> Rewind | None:
    """The rewind a committed record makes (None: the record is no committed rewind)."""
    if row.kind != OpKind.SANDBOX_RESTORE.value or row.name != REWIND or row.status != "completed":
        return None
    meta = row.meta or {}
    sandbox = meta.get(META_SANDBOX)
    return Rewind(int(meta[META_TO]), tuple(str(op) for op in meta.get(META_REWOUND) or ()),
                  str(sandbox) if sandbox else None)

