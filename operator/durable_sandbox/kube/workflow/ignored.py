"""Changes to a finished Workflow's spec: said, not silently dropped.

A finished run (succeeded, failed with no attempt left, cancelled) is not run again: its Workflow is one run.
A ``spec.signals``, ``spec.suspend`` or ``spec.cancel`` patch on it is accepted by the API server (``kubectl``
prints ``patched``) and changes nothing, so the operator says so: a Warning Event and the Ready condition's
reason name the field, and the message says what to do instead. A change is noticed when the Workflow's
generation moves past the one its final status was written for."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from durable_sandbox.engine.records import RunRecord, RunStatus

__all__ = ["RERUN_HINT", "ignored_fields", "ignored_notice"]

RERUN_HINT = ("to run it again, re-create it (`kubectl replace --force -f <file>`, or apply it under a new name); "
              "a failed one is retried in place by adding spec.retry")

_REASONS: Final[Mapping[str, str]] = {"spec.cancel": "CancelIgnored", "spec.suspend": "SuspendIgnored"}


def ignored_fields(spec: Mapping[str, Any], run: RunRecord, answered: Iterable[str]) -> list[str]:
    """The steering fields of ``spec`` that ask a finished ``run`` for something it will not do: a cancel of a
    run that was not cancelled, a suspend, signals for callbacks the run never answered."""
    fields = []
    if spec.get("cancel") is True and run.status != RunStatus.CANCELLED:
        fields.append("spec.cancel")
    if spec.get("suspend") is True:
        fields.append("spec.suspend")
    done = set(answered)
    signals = spec.get("signals")
    if isinstance(signals, Mapping):
        fields.extend(f"spec.signals.{key}" for key in sorted(signals) if key not in done)
    return fields


def ignored_notice(fields: list[str], phase: str, generation: int) -> tuple[str, str]:
    """The (reason, message) of the Ready condition and the Event: the first field names the reason (a change
    that asks for nothing, e.g. spec.suspend set back to false, is ``ChangeIgnored``)."""
    if not fields:
        reason, what = "ChangeIgnored", "the spec"
    else:
        reason = _REASONS.get(fields[0], "SignalIgnored")
        what = ", ".join(fields)
    ended = "was cancelled" if phase == "Cancelled" else phase.lower()
    message = (f"{what} changed (generation {generation}) after the run {ended}: a finished Workflow does "
               f"not act on spec changes; {RERUN_HINT}")
    return reason, message
