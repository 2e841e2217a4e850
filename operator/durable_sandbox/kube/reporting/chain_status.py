"""``status.runs``: a Workflow's continue-as-new chain (``ctx.continue_as_new``, engine/continue_as_new.py) as its
status shows it, from the runs' own records in the journal.

Newest first, at most :data:`RUNS_SHOWN` entries (the chain may grow for ever; ``dsb --kube inspect <run>``
shows it all). Each entry: the run id, how it ended (``ContinuedAsNew``, or the phase of a run that did not
continue: Running, Succeeded, Failed...) and when it started and finished. A run that never continued as new
shows no ``runs`` (its status is the run's own)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.continue_as_new import continued_to
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.kube.reporting.status import phase_of
from durable_sandbox.kube.spec.conditions import rfc3339

__all__ = ["CONTINUED_AS_NEW", "RUNS_SHOWN", "chain_status"]

RUNS_SHOWN = 20
CONTINUED_AS_NEW = "ContinuedAsNew"


def chain_status(earlier: Sequence[RunRecord], current: RunRecord | None, *,
                 limit: int = RUNS_SHOWN) -> list[dict[str, Any]]:
    """``status.runs`` of a chain: ``earlier`` its ended runs in order (oldest first, each continued as the next),
    ``current`` the run it is at now; newest first, at most ``limit``. Empty while there is no chain."""
    if not earlier:
        return []
    runs = [*earlier, *([current] if current is not None else [])]
    return [_entry(run) for run in reversed(runs[-limit:])]


def _entry(run: RunRecord) -> dict[str, Any]:
    ended = continued_to(run) is not None
    return {
        "runId": run.run_id,
        "outcome": CONTINUED_AS_NEW if ended else phase_of(run),
        "startedAt": rfc3339(run.created_at),
        "finishedAt": rfc3339(run.updated_at) if run.status.terminal else None,
    }
