"""What the two SQL stores decide the same way, written once: which run fields a change may set, when a fenced
write is refused and why, which runs ``claim_next`` may hand out, how ``list_runs`` filters, and when a signal
sent again is a repeat or a conflict.

The stores differ only in how a statement names its parameters (SQLite ``?``, PostgreSQL ``$1``): a
:class:`Params` of each kind collects the values in the order the shared builders place them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from durable_sandbox.engine.builds import BUILD_LABEL, PAST_BUILDS_LABEL, BuildClaims
from durable_sandbox.engine.errors import LeaseLost, RunCancelledError, RunConflict, SignalConflict
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.stores.sql_rows import canonical, change_value

__all__ = ["SETTABLE", "NumberedParams", "Params", "QmarkParams", "build_sql", "list_runs_sql", "refuse_other_run",
           "refuse_unfenced", "repeated_signal", "runnable_sql", "set_columns", "set_values"]

# What update_run and a commit's run changes may set (never the run id, the fence or the journal's counter):
# the keys are spliced into the statement, so nothing else may pass.
SETTABLE = frozenset({"workflow", "status", "input", "result", "error", "thread_id", "created_at", "wake_at",
                      "pending_callbacks", "cancel_requested", "epoch", "lease_owner", "lease_expires_at", "labels",
                      "workflow_ref"})


class Params(Protocol):
    """A statement's parameters as the store's driver names them; ``values`` in the order they were placed."""

    values: list[Any]

    def add(self, value: Any) -> str:
        """Place ``value``; returns its placeholder."""
        ...

    def one_of(self, values: Sequence[Any]) -> str:
        """Place a list of text values; returns the condition's right side (``IN (...)``, ``= ANY(...)``)."""
        ...


class QmarkParams:
    """SQLite's ``?`` parameters."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        self.values.append(value)
        return "?"

    def one_of(self, values: Sequence[Any]) -> str:
        self.values.extend(values)
        return f"IN ({','.join('?' * len(values))})"


class NumberedParams:
    """PostgreSQL's ``$n`` parameters, numbered after the ``taken`` ones the statement places itself."""

    def __init__(self, taken: int = 0) -> None:
        self.values: list[Any] = []
        self._taken = taken

    def add(self, value: Any) -> str:
        self.values.append(value)
        return f"${self._taken + len(self.values)}"

    def one_of(self, values: Sequence[Any]) -> str:
        return f"= ANY({self.add(list(values))}::text[])"


def set_columns(keys: Sequence[str]) -> list[str]:
    """The columns a change of run fields ``keys`` sets: those, then ``updated_at``. ValueError for a key that
    is not a field a change may set."""
    for key in keys:
        if key not in SETTABLE:
            raise ValueError(f"not a run field that can be changed: {key!r}")
    return [*keys, "updated_at"]


def set_values(changes: Mapping[str, Any], now: float) -> list[Any]:
    """The cells for :func:`set_columns` of ``changes``' keys, in the same order (``now`` is ``updated_at``)."""
    return [*(change_value(key, value) for key, value in changes.items()), now]


def refuse_unfenced(run_id: str, fence: int, found: tuple[int, str | None] | None, check_cancel: bool) -> None:
    """Raise why a write fenced by ``fence`` may not land, given the run's (fence, cancel_requested) as ``found``
    (None: no such run): ``LeaseLost`` when the run is gone or its fence moved on, ``RunCancelledError`` when
    ``check_cancel`` and a cancel was requested. Returns when the write may land."""
    if found is None or found[0] != fence:
        raise LeaseLost(run_id, fence)
    if check_cancel and found[1] is not None:
        raise RunCancelledError(run_id, found[1])


def list_runs_sql(table: str, columns: str, params: Params, *, status: Sequence[RunStatus] | None,
                  workflow: str | None, limit: int) -> str:
    """``list_runs``' query: runs of any of ``status`` and of ``workflow`` (when given), newest first."""
    where: list[str] = []
    if status:
        where.append(f"status {params.one_of([RunStatus(s).value for s in status])}")
    if workflow:
        where.append(f"workflow = {params.add(workflow)}")
    sql = f"SELECT {columns} FROM {table}" + (" WHERE " + " AND ".join(where) if where else "")
    return sql + f" ORDER BY created_at DESC LIMIT {params.add(limit)}"


def runnable_sql(params: Params, now: float, *, lease_clock: str | None = None,
                 workflows: Sequence[str] | None = None, build: BuildClaims | None = None,
                 label: Callable[[str], str] | None = None) -> str:
    """The condition on a run ``claim_next`` may hand out: no live lease (by ``lease_clock``, the SQL of the
    clock leases are judged by; default ``now``), and pending, running (its worker died), waiting and due by
    ``now``, or waiting or suspended with a cancel request; of ``workflows`` when given; one a worker of
    ``build`` may take (:func:`build_sql`, run labels read by ``label``) when given."""
    lease_now = lease_clock if lease_clock is not None else params.add(now)
    condition = (
        f"(lease_owner IS NULL OR lease_expires_at < {lease_now}) AND (status IN ('pending', 'running') "
        f"OR (status = 'waiting' AND wake_at IS NOT NULL AND wake_at <= {params.add(now)}) "
        f"OR (cancel_requested IS NOT NULL AND status IN ('waiting', 'suspended')))"
    )
    if workflows:
        condition += f" AND workflow {params.one_of(workflows)}"
    if build is not None:
        if label is None:
            raise ValueError("runnable_sql: a build to claim for needs the store's `label` (the SQL of a run label)")
        condition += f" AND {build_sql(params, build, label)}"
    return condition


def build_sql(params: Params, build: BuildClaims, label: Callable[[str], str]) -> str:
    """engine/builds.py ``may_take`` as a condition on a run (``BuildClaims.admits`` in SQL): pinned to no build
    or to ``build``'s, or (its workflow not one ``build`` knows is pinned) ``build``'s id not among the builds
    it was on before. ``label(key)`` is the store's SQL of a run label's text (NULL when absent).

    It is one more conjunct after the lease and status conditions, so a claim still walks the index those use
    (SQLite ``runs_status``, PostgreSQL ``runs_runnable``) and tests only the runnable rows. The past builds are
    a comma-separated list matched with ``replace`` (exact and case-sensitive in both stores, unlike ``LIKE``)."""
    pinned = f"COALESCE({label(BUILD_LABEL)}, '')"
    past = f"(',' || COALESCE({label(PAST_BUILDS_LABEL)}, '') || ',')"
    own = f"CAST({params.add(build.build_id)} AS TEXT)"
    never_here = f"CAST({params.add(',' + build.build_id + ',')} AS TEXT)"
    upgrade = f"replace({past}, {never_here}, '') = {past}"
    if build.pinned_workflows:
        upgrade += f" AND NOT (workflow {params.one_of(sorted(build.pinned_workflows))})"
    return f"({pinned} = '' OR {pinned} = {own} OR ({upgrade}))"


def repeated_signal(run_id: str, callback_id: str, stored: str | None, value: Any) -> bool:
    """A signal sent again for ``callback_id``, whose stored value is ``stored`` (None: gone meanwhile): False
    (nothing to do) when it is the same value in any spelling, else ``SignalConflict``."""
    if stored is not None and canonical(json.loads(stored)) == canonical(value):
        return False
    raise SignalConflict(run_id, callback_id)


def refuse_other_run(stored: RunRecord, new: RunRecord) -> None:
    """``commit_with_new_run`` found a run of the new run's id: it is kept if it is that run (a commit offered
    again), else the commit is refused (``RunConflict``), writing nothing."""
    if (stored.workflow, stored.input, stored.labels) != (new.workflow, new.input, new.labels):
        raise RunConflict(
            f"Run {new.run_id!r} exists already (workflow {stored.workflow!r}) and is not the run this commit "
            f"creates (workflow {new.workflow!r}); nothing was written: delete that run or start a new chain"
        )
