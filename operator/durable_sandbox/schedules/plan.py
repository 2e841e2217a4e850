"""One turn of a schedule, planned: given the tick last recorded, now, the policy and the children the schedule
owns, what to create, what to delete and what to record. Pure: the Kubernetes controller (kube/schedule/) and
``dsb schedule run-due`` (runs/schedules.py) read the world, call :func:`plan_turn` and carry the plan out.

The rules (as Kubernetes CronJob has them, with the losses said):

* the ticks due are those after the last recorded one (or after the schedule's creation) up to now. Only the
  newest runs; older ones were missed while nothing ran the schedule (an operator down) and are recorded as
  missed (status ``missedTicks``, a Warning Event), never run late in a burst and never dropped silently;
* the newest runs only within ``startingDeadlineSeconds`` of its time; later it is missed too;
* a tick whose child exists already (made before a crash that lost the record) is recorded, not made again:
  children are named by their tick (timing.tick_name), so a tick can never have two;
* ``Forbid``: while a child is active the due tick waits (it runs when the child ends, within the deadline);
  ``Replace``: the active children are deleted and the tick runs; ``Allow``: it runs beside them;
* ``suspend``: due ticks are passed over (recorded as skipped, not missed, and not run on resume);
* finished children beyond ``successfulRunsHistoryLimit``/``failedRunsHistoryLimit`` are deleted, oldest first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from durable_sandbox.schedules.timing import Timing, tick_name

__all__ = ["Child", "ChildState", "Concurrency", "Policy", "TurnPlan", "plan_turn"]

# Ticks looked at past the last recorded one: a schedule left alone for longer reports this many missed ticks
# and "and more" (the count is exact up to it), as CronJob stops counting at 100.
MISSED_SCAN_LIMIT = 100


class Concurrency(StrEnum):
    ALLOW = "Allow"
    FORBID = "Forbid"
    REPLACE = "Replace"


class ChildState(StrEnum):
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # failed or cancelled


@dataclass(frozen=True)
class Child:
    """A Workflow (or local run) the schedule made, as its owner knows it (never taken from a label)."""

    name: str
    uid: str
    state: ChildState
    finished_at: dt.datetime | None = None


@dataclass(frozen=True)
class Policy:
    concurrency: Concurrency = Concurrency.ALLOW
    starting_deadline_seconds: int | None = None
    successful_history: int = 3
    failed_history: int = 1
    suspend: bool = False


@dataclass
class TurnPlan:
    create: dt.datetime | None = None  # the tick to make a child for (named tick_name(schedule, create))
    delete: list[Child] = field(default_factory=list)  # Replace's active children, then history beyond its limits
    record: dt.datetime | None = None  # the new last schedule time (None: unchanged)
    missed: list[dt.datetime] = field(default_factory=list)  # ticks not run (too late, or superseded)
    more_missed: bool = False  # more ticks were missed than MISSED_SCAN_LIMIT
    skipped: int = 0  # ticks passed over while suspended
    waiting: str | None = None  # why the due tick waits (Forbid), for status
    next: dt.datetime | None = None  # the next tick after now
    already_made: dt.datetime | None = None  # the due tick's child existed already (a crash lost the record)


def _history(children: Sequence[Child], policy: Policy) -> list[Child]:
    def by_age(state: ChildState) -> list[Child]:
        done = [c for c in children if c.state == state]
        far_past = dt.datetime.min.replace(tzinfo=dt.UTC)
        return sorted(done, key=lambda c: (c.finished_at or far_past, c.name), reverse=True)

    return [*by_age(ChildState.SUCCEEDED)[policy.successful_history:], *by_age(ChildState.FAILED)[policy.failed_history:]]


def plan_turn(schedule: str, timing: Timing, policy: Policy, *, now: dt.datetime, since: dt.datetime,
              children: Sequence[Child]) -> TurnPlan:
    """The turn of ``schedule`` at ``now``. ``since``: the last recorded tick, else the schedule's creation;
    ``children``: only those the caller proved are the schedule's (owner uid, or the run id it made)."""
    plan = TurnPlan(next=timing.next_after(max(now, since)))
    plan.delete = _history(children, policy)
    due, more = timing.ticks(since, now, MISSED_SCAN_LIMIT)
    if not due:
        return plan
    latest = timing.latest_at_or_before(now) if more else due[-1]
    assert latest is not None
    if policy.suspend:
        plan.record, plan.skipped = latest, len(due)
        return plan
    names = {c.name: c for c in children}
    # Older due ticks never run: superseded by the newest (missed, unless their child was made before a crash).
    plan.missed = [t for t in due if t != latest and tick_name(schedule, t) not in names]
    plan.more_missed = more
    if tick_name(schedule, latest) in names:
        plan.record = plan.already_made = latest
        return plan
    late = policy.starting_deadline_seconds is not None and (now - latest).total_seconds() > policy.starting_deadline_seconds
    if late:
        plan.missed.append(latest)
        plan.record = latest
        return plan
    active = [c for c in children if c.state == ChildState.ACTIVE]
    if active and policy.concurrency == Concurrency.FORBID:
        running = ", ".join(sorted(c.name for c in active))
        plan.waiting = f"{len(active)} run(s) still active ({running}); concurrencyPolicy is Forbid"
        if plan.missed:  # superseded ones are missed whatever the newest does: recorded, said once
            plan.record = max(plan.missed)
        return plan
    if active and policy.concurrency == Concurrency.REPLACE:
        plan.delete = [*active, *plan.delete]
    plan.create = plan.record = latest
    return plan
