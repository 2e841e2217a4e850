"""A run's summary: its state with its live snapshots, recoveries and calls, built in one place.

``dsb inspect`` (through the engine's :class:`~durable_sandbox.sandboxes.journal.SandboxJournal` reader), the
web view's run header (``ui/local.py``, ``ui/cluster.py``) and the Workflow's status (``kube/reporting/status.py``'s
``Projection``) all count from ``sandboxes.journal.Tally``, so the page, the CLI and ``kubectl describe`` cannot disagree
on how many recoveries a run had or which of its snapshots are live.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine.client import state_of
from durable_sandbox.engine.records import OperationRecord, RunRecord
from durable_sandbox.engine.state import RunState
from durable_sandbox.sandboxes import journal

__all__ = ["RunSummary", "summarize", "total_calls"]


def total_calls(run_input: Any) -> int | None:
    """The run's calls when its input says (a Workflow manifest's ``toolCalls``)."""
    if isinstance(run_input, dict) and isinstance(run_input.get("toolCalls"), list):
        return len(run_input["toolCalls"])
    return None


@dataclass
class RunSummary:
    state: RunState  # snapshots and recoveryCount from the same Tally as calls
    calls_done: int | None  # None, None: a run that made no sandbox call and has no total
    calls_total: int | None


def summarize(run: RunRecord, rows: list[OperationRecord]) -> RunSummary:
    """The summary of ``run`` from its journal ``rows`` (in commit order)."""
    tally = journal.Tally().feed(rows)  # one pass over the journal for the state's counts and the calls
    state = state_of(run, rows, _Tallied(tally))
    done, of = tally.calls(total_calls(run.input))
    return RunSummary(state, done if of else None, of or None)


class _Tallied(journal.SandboxJournal):
    """The sandbox journal reader, its counts taken from a tally already made of the same rows."""

    def __init__(self, tally: journal.Tally) -> None:
        self.tally = tally

    def snapshots(self, rows: Iterable[OperationRecord]) -> list[str]:
        return self.tally.live_snapshots

    def recoveries(self, rows: Iterable[OperationRecord]) -> int:
        return self.tally.recoveries
