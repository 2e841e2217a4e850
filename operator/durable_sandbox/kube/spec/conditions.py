"""metav1.Condition helpers, the same for Workflows (``kube/reporting/status.py``) and Sandboxes (``kube/sandbox/``).

A condition's ``lastTransitionTime`` moves only when its status flips, as metav1.Condition says;
messages are for people and cut to ``MESSAGE_LIMIT`` (the journal, or the provider's answer, has the rest).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["MESSAGE_LIMIT", "SANDBOX_CONDITIONS", "WORKFLOW_CONDITIONS", "by_type", "condition", "cut", "find",
           "merge", "rfc3339"]

MESSAGE_LIMIT = 1024

# The condition types of each resource, in the order status lists them (and the CRDs' docs name them).
WORKFLOW_CONDITIONS = ("Ready", "Succeeded", "Failed", "Suspended", "WaitingForSignal", "WaitingForWorker", "Recovering",
                       "CleanupBlocked")
SANDBOX_CONDITIONS = ("Ready", "Suspended", "CleanupBlocked")

Condition = dict[str, Any]
State = tuple[bool, str, str]  # (on, reason, message)


def rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cut(text: str, limit: int = MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def by_type(conditions: Iterable[Any]) -> dict[str, Condition]:
    """Conditions as last written (a status's list, possibly malformed) by type."""
    return {c.get("type", ""): c for c in conditions or () if isinstance(c, dict)}


def find(conditions: Iterable[Any], ctype: str) -> Condition | None:
    return by_type(conditions).get(ctype)


def condition(ctype: str, on: bool, reason: str, message: str, generation: int | None,
              previous: Mapping[str, Condition]) -> Condition:
    """One metav1.Condition; ``previous`` maps type -> the condition as last written."""
    status = "True" if on else "False"
    prev = previous.get(ctype)
    changed_at = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": cut(message),
        "lastTransitionTime": changed_at or rfc3339(time.time()),
        "observedGeneration": generation,
    }


def merge(conditions: Iterable[Any], states: Mapping[str, State], generation: int | None,
          order: Sequence[str]) -> list[Condition]:
    """The conditions with ``states`` (type -> (on, reason, message)) applied over the current ones, the types
    of ``order`` first in that order, then the others as they were."""
    previous = by_type(conditions)
    merged = dict(previous)
    for ctype, (on, reason, message) in states.items():
        merged[ctype] = condition(ctype, on, reason, message, generation, previous)
    return [merged[t] for t in order if t in merged] + [c for t, c in merged.items() if t not in order]
