"""What the run page calls each run event, and of which kind it is: a pure function of the event, apart from the
timeline that places it (ui/timeline.py: lanes, and what an interruption ends)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from durable_sandbox.engine.records import Event
from durable_sandbox.engine.wording import counted

__all__ = ["STOPPED", "event_view"]

# The run events after which the run does not execute (until it is started or resumed again).
STOPPED: Final = frozenset({"run.waiting", "run.handed_over", "run.interrupted", "run.failed", "run.succeeded",
                            "run.cancelled"})
_RUN_OUTCOMES: Final[Mapping[str, str]] = {"run.interrupted": "warning", "run.failed": "failed",
                                           "run.cancelled": "warning", "run.succeeded": "ok"}


def event_view(event: Event) -> tuple[str, str, str]:
    """(kind, label, outcome) of a run event on the timeline."""
    data = event.data or {}
    etype = event.type
    if etype == "signal.received":
        return "signal", f"signal received for {data.get('callbackId')}", "info"
    if etype == "progress":
        pct = data.get("percent")
        return "progress", str(data.get("message", "")) + (f" ({pct:g}%)" if isinstance(pct, int | float) else ""), "info"
    if etype == "run.handed_over":
        reason = str(data.get("reason") or "")
        return "suspend" if "suspend" in reason else "run", f"handed over: {reason}" if reason else "handed over", "info"
    if etype.startswith("run."):
        label = f"run {etype[4:]}"
        if etype == "run.waiting":
            label += " for " + (", ".join(data.get("callbacks") or []) or "a timer")
        if data.get("worker"):
            label += f" (worker {data['worker']})"
        why = data.get("error") or data.get("reason")
        if etype in ("run.failed", "run.cancelled") and why:
            label += f": {why}"
        return "run", label, _RUN_OUTCOMES.get(etype, "info")
    if etype == "sandbox.lost":
        return "lost", f"sandbox lost ({data.get('session', '?')}): {data.get('reason', '')}", "warning"
    if etype == "sandbox.hibernated":
        return "hibernate", (f"sandbox hibernated ({data.get('session', '?')}) after "
                             f"{counted(data.get('count', '?'), 'call')}"), "info"
    return "event", etype, "info"
