"""The pure planner of a schedule's turn (schedules/plan.py): missed ticks, deadlines, concurrency policies,
history limits, suspend, a tick made before a crash that lost its record."""

from __future__ import annotations

import datetime as dt

from durable_sandbox.schedules import Child, ChildState, Concurrency, Policy, Timing, plan_turn, tick_name
from durable_sandbox.schedules.plan import MISSED_SCAN_LIMIT

UTC = dt.UTC
EVERY_MINUTE = Timing.of(schedule="* * * * *")


def at(hour: int, minute: int, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 5, 1, hour, minute, second, tzinfo=UTC)


def child(tick: dt.datetime, state: ChildState = ChildState.ACTIVE, finished: dt.datetime | None = None) -> Child:
    return Child(name=tick_name("s", tick), uid=f"uid-{int(tick.timestamp())}", state=state, finished_at=finished)


def test_nothing_due_says_when_next() -> None:
    plan = plan_turn("s", EVERY_MINUTE, Policy(), now=at(10, 0, 30), since=at(10, 0), children=[])
    assert plan.create is None and plan.record is None and plan.next == at(10, 1) and not plan.missed


def test_a_due_tick_is_made_and_recorded() -> None:
    plan = plan_turn("s", EVERY_MINUTE, Policy(), now=at(10, 1, 2), since=at(10, 0), children=[])
    assert plan.create == plan.record == at(10, 1) and plan.next == at(10, 2) and not plan.missed


def test_ticks_missed_while_down_only_the_newest_runs_the_rest_recorded() -> None:
    plan = plan_turn("s", EVERY_MINUTE, Policy(), now=at(10, 5, 10), since=at(10, 0), children=[])
    assert plan.create == at(10, 5)
    assert plan.missed == [at(10, 1), at(10, 2), at(10, 3), at(10, 4)] and not plan.more_missed


def test_too_late_for_the_deadline_is_missed_not_run() -> None:
    policy = Policy(starting_deadline_seconds=30)
    plan = plan_turn("s", EVERY_MINUTE, policy, now=at(10, 1, 45), since=at(10, 0), children=[])
    assert plan.create is None and plan.missed == [at(10, 1)] and plan.record == at(10, 1)
    plan = plan_turn("s", EVERY_MINUTE, policy, now=at(10, 1, 29), since=at(10, 0), children=[])
    assert plan.create == at(10, 1), "within the deadline it runs"


def test_more_missed_than_the_scan_limit() -> None:
    plan = plan_turn("s", EVERY_MINUTE, Policy(), now=at(20, 0, 1), since=at(10, 0), children=[])
    assert plan.create == at(20, 0) and len(plan.missed) == MISSED_SCAN_LIMIT and plan.more_missed


def test_a_tick_made_before_a_crash_is_recorded_not_made_again() -> None:
    made = child(at(10, 1))
    plan = plan_turn("s", EVERY_MINUTE, Policy(), now=at(10, 1, 20), since=at(10, 0), children=[made])
    assert plan.create is None and plan.already_made == plan.record == at(10, 1)
    # ...and an older tick whose child exists is neither missed nor made again.
    plan = plan_turn("s", EVERY_MINUTE, Policy(), now=at(10, 2, 5), since=at(10, 0), children=[made])
    assert plan.missed == [] and plan.create == at(10, 2)


def test_forbid_waits_while_a_child_runs_then_runs_within_the_deadline() -> None:
    running = child(at(10, 0))
    policy = Policy(concurrency=Concurrency.FORBID, starting_deadline_seconds=120)
    plan = plan_turn("s", EVERY_MINUTE, policy, now=at(10, 1, 5), since=at(10, 0), children=[running])
    assert plan.create is None and plan.record is None and "Forbid" in (plan.waiting or "")
    ended = child(at(10, 0), ChildState.SUCCEEDED, at(10, 1, 30))
    plan = plan_turn("s", EVERY_MINUTE, policy, now=at(10, 1, 40), since=at(10, 0), children=[ended])
    assert plan.create == at(10, 1)
    plan = plan_turn("s", EVERY_MINUTE, policy, now=at(10, 4, 0), since=at(10, 0), children=[running])
    assert plan.create is None and plan.missed == [at(10, 1), at(10, 2), at(10, 3)] and plan.record == at(10, 3)


def test_replace_deletes_the_active_ones_and_runs() -> None:
    running = child(at(10, 0))
    plan = plan_turn("s", EVERY_MINUTE, Policy(concurrency=Concurrency.REPLACE), now=at(10, 1, 5), since=at(10, 0),
                     children=[running])
    assert plan.create == at(10, 1) and plan.delete == [running]


def test_allow_runs_beside_them() -> None:
    running = child(at(10, 0))
    plan = plan_turn("s", EVERY_MINUTE, Policy(), now=at(10, 1, 5), since=at(10, 0), children=[running])
    assert plan.create == at(10, 1) and plan.delete == []


def test_history_limits_delete_the_oldest_finished() -> None:
    ok = [child(at(9, m), ChildState.SUCCEEDED, at(9, m, 30)) for m in range(5)]
    bad = [child(at(8, m), ChildState.FAILED, at(8, m, 30)) for m in range(3)]
    running = child(at(9, 50))
    policy = Policy(successful_history=2, failed_history=1)
    plan = plan_turn("s", EVERY_MINUTE, policy, now=at(10, 0, 30), since=at(10, 0), children=[*ok, *bad, running])
    assert {c.name for c in plan.delete} == {c.name for c in [*ok[:3], *bad[:2]]}
    keep_none = plan_turn("s", EVERY_MINUTE, Policy(successful_history=0, failed_history=0), now=at(10, 0, 30),
                          since=at(10, 0), children=[*ok, *bad, running])
    assert running not in keep_none.delete and len(keep_none.delete) == 8


def test_suspend_passes_ticks_over_without_running_or_missing_them() -> None:
    plan = plan_turn("s", EVERY_MINUTE, Policy(suspend=True), now=at(10, 3, 5), since=at(10, 0), children=[])
    assert plan.create is None and plan.missed == [] and plan.skipped == 3 and plan.record == at(10, 3)


def test_a_time_zone_schedule_across_spring_forward() -> None:
    timing = Timing.of(schedule="30 2 * * *", time_zone="America/New_York")
    since = dt.datetime(2026, 3, 7, 12, tzinfo=UTC)
    now = dt.datetime(2026, 3, 8, 7, 31, tzinfo=UTC)  # 03:31 EDT, the day 02:30 does not exist
    plan = plan_turn("s", timing, Policy(), now=now, since=since, children=[])
    assert plan.create == dt.datetime(2026, 3, 8, 7, 30, tzinfo=UTC) and plan.missed == []
