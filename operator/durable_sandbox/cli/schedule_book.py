"""``dsb schedule``: schedules of the local store, kept in a small JSON book beside it (``<store>.schedules.json``),
and one turn of each (``run-due``, or ``dsb worker --schedules`` every poll).

A turn is the same pure plan as the operator's (``schedules.plan_turn``). Each tick's run id is
``<schedule>-<Unix time of the tick>`` (``schedules.tick_name``), and the store's create-run is idempotent, so
two workers (or one that crashed between creating a run and writing the book) never make a tick twice: the run
of the newest due tick is looked up by its id first, and found made, it is recorded, not made again. The book is
read and written under an exclusive lock (``fcntl.flock``), so workers on one machine take turns.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from durable_sandbox.engine import Engine, RunRecord, RunStatus, faults
from durable_sandbox.schedules import (
    NAME_MAX,
    Child,
    ChildState,
    Concurrency,
    Policy,
    Timing,
    plan_turn,
    tick_name,
)

__all__ = ["CREATED_FAULT", "LocalSchedule", "ScheduleBook", "Ticked", "run_due"]

CREATED_FAULT = "schedule.created"  # engine/faults.py: after a tick's run is created, before the book records it
_MADE_KEPT = 20  # run ids a schedule remembers (the active ones among them steer Forbid and Replace)
_NO_LIMIT = 1_000_000  # the local store keeps every run: `dsb prune` removes finished ones


def _iso(when: dt.datetime | None) -> str | None:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if when is not None else None


def _time(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


class LocalSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    cron: str | None = None
    time_zone: str | None = None
    every: str | None = None
    concurrency: Concurrency = Concurrency.ALLOW
    starting_deadline_seconds: int | None = Field(default=None, ge=0)
    target: str  # what `dsb run` takes: a manifest (one Workflow) or module:function
    input: JsonValue = None
    created: str
    last_schedule_time: str | None = None
    made: list[str] = Field(default_factory=list)
    missed_ticks: int = 0

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or len(value) > NAME_MAX or not all(c.isalnum() or c in "-._" for c in value):
            raise ValueError(f"schedule name {value!r}: use 1 to {NAME_MAX} letters, digits, '-', '.' or '_'")
        return value

    def timing(self) -> Timing:
        return Timing.of(schedule=self.cron, time_zone=self.time_zone, every=self.every)

    def describe(self) -> str:
        return f"every {self.every}" if self.every else f"{self.cron} ({self.time_zone or 'UTC'})"


class ScheduleBook:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, LocalSchedule]]:
        """The schedules by name, to read and change; written back when the block ends without an error."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            raw = json.loads(self.path.read_text()) if self.path.exists() else {}
            book = {name: LocalSchedule.model_validate(entry) for name, entry in raw.items()}
            yield book
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({n: s.model_dump(mode="json") for n, s in sorted(book.items())}, indent=2))
            os.replace(tmp, self.path)

    def entries(self) -> list[LocalSchedule]:
        with self.locked() as book:
            return list(book.values())


class Ticked(BaseModel):
    schedule: str
    created: str | None = None  # the run made now
    recorded: str | None = None  # a run made before (a crash lost the record)
    missed: list[str] = Field(default_factory=list)
    waiting: str | None = None
    cancelled: list[str] = Field(default_factory=list)  # Replace
    next: str | None = None


def _child(run: RunRecord) -> Child:
    if not run.status.terminal:
        return Child(name=run.run_id, uid=run.run_id, state=ChildState.ACTIVE)
    state = ChildState.SUCCEEDED if run.status == RunStatus.SUCCEEDED else ChildState.FAILED
    return Child(name=run.run_id, uid=run.run_id, state=state, finished_at=dt.datetime.fromtimestamp(run.updated_at, dt.UTC))


Submit = Callable[[Engine, LocalSchedule, str], Awaitable[Any]]


async def _turn(engine: Engine, entry: LocalSchedule, now: dt.datetime, submit: Submit) -> Ticked:
    timing = entry.timing()
    policy = Policy(concurrency=entry.concurrency, starting_deadline_seconds=entry.starting_deadline_seconds,
                    successful_history=_NO_LIMIT, failed_history=_NO_LIMIT)
    latest = timing.latest_at_or_before(now)
    ids = [*entry.made, *([tick_name(entry.name, latest)] if latest is not None else [])]
    runs = [run for run_id in dict.fromkeys(ids) if (run := await engine.store.get_run(run_id)) is not None]
    since = _time(entry.last_schedule_time) or _time(entry.created) or now
    plan = plan_turn(entry.name, timing, policy, now=now, since=since, children=[_child(r) for r in runs])
    out = Ticked(schedule=entry.name, missed=[_iso(t) or "" for t in plan.missed], waiting=plan.waiting,
                 next=_iso(plan.next))
    for child in plan.delete:  # Replace's active runs (history is never pruned here)
        await engine.cancel(child.name, f"replaced by a newer tick of schedule {entry.name} (concurrency Replace)")
        out.cancelled.append(child.name)
    if plan.create is not None:
        run_id = tick_name(entry.name, plan.create)
        await submit(engine, entry, run_id)
        faults.reach(CREATED_FAULT)
        out.created = run_id
    elif plan.already_made is not None:
        out.recorded = tick_name(entry.name, plan.already_made)
    made = out.created or out.recorded
    if plan.record is not None:
        entry.last_schedule_time = _iso(plan.record)
    if made is not None and made not in entry.made:
        entry.made = [*entry.made, made][-_MADE_KEPT:]
    entry.missed_ticks += len(plan.missed)
    return out


async def run_due(engine: Engine, book: ScheduleBook, now: dt.datetime, submit: Submit) -> list[Ticked]:
    """One turn of every schedule in ``book`` at ``now``: the runs due are created (pending: a worker runs them)."""
    out = []
    with book.locked() as entries:
        for entry in entries.values():
            out.append(await _turn(engine, entry, now, submit))
    return out
