"""When an idle Sandbox is suspended (``spec.idleSuspendAfterSeconds``), and what ``kubectl get dsbx`` says of
it: pure planning, no I/O (the controller reads the inputs from the Sandbox's record and acts on the plan).

A Sandbox is *active* while a Workflow whose run goes on holds it (its calls may come at any moment, so the idle
timer never runs then), *idle* while it is live and nobody holds it (since ``lastActiveAt``: when a Workflow
last let go of it or took it, or when it was made live), and *suspended* while it has no live sandbox. The idle
timer is due ``idleSuspendAfterSeconds`` after ``lastActiveAt``. Every input comes from the operator's own
sealed record, never from status: whoever may write ``sandboxes/status`` cannot make a Sandbox suspend (or stay
up) early.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ACTIVE", "IDLE", "SUSPENDED", "IdlePlan", "SandboxState", "plan_idle"]

SandboxState = Literal["Ready", "Idle", "Suspended"]
ACTIVE: SandboxState = "Ready"  # live and held by a running Workflow
IDLE: SandboxState = "Idle"  # live, nobody holds it
SUSPENDED: SandboxState = "Suspended"  # no live sandbox (spec.suspend, or the idle timer)


@dataclass(frozen=True)
class IdlePlan:
    state: SandboxState
    since: float | None  # epoch seconds the state holds since (None: not known yet)
    suspend: bool = False  # the idle timer is due: suspend now
    due_in: float | None = None  # seconds until it is due (None: no timer runs)


def plan_idle(*, after: int | None, live: bool, held: bool, last_active: float | None, suspended_at: float | None,
              now: float) -> IdlePlan:
    """The state of a Sandbox and whether the idle timer suspends it now.

    ``after``: ``spec.idleSuspendAfterSeconds`` (None: never on idleness); ``live``: it has a live sandbox;
    ``held``: a Workflow whose run goes on holds it; ``last_active``: the record's ``lastActiveAt``;
    ``suspended_at``: when it was last suspended."""
    if not live:
        return IdlePlan(SUSPENDED, suspended_at)
    if held:
        return IdlePlan(ACTIVE, last_active)
    if after is None or last_active is None:
        return IdlePlan(IDLE, last_active)
    due_in = last_active + after - now
    return IdlePlan(IDLE, last_active, suspend=due_in <= 0, due_in=max(0.0, due_in))
