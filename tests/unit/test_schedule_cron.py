"""The cron parser and the schedule timing (schedules/cron.py, schedules/timing.py): syntax, refusals, time zones
and daylight-saving days, ``every``."""

from __future__ import annotations

import datetime as dt

import pytest

from durable_sandbox.schedules import CronError, CronExpression, Timing, parse_every, tick_name

UTC = dt.UTC


def at(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def following(timing: Timing, start: dt.datetime, n: int) -> list[dt.datetime]:
    out, tick = [], start
    for _ in range(n):
        tick = timing.next_after(tick)
        out.append(tick)
    return out


def test_fields_ranges_steps_lists_and_names() -> None:
    cron = CronExpression.parse("*/15 9-17/4 1,15 jan-mar MON-fri")
    assert cron.minutes == {0, 15, 30, 45} and cron.hours == {9, 13, 17}
    assert cron.days == {1, 15} and cron.months == {1, 2, 3} and cron.weekdays == {1, 2, 3, 4, 5}
    assert CronExpression.parse("0 0 * * 7").weekdays == {0}, "7 is Sunday too"
    assert CronExpression.parse("5/20 * * * *").minutes == {5, 25, 45}
    assert CronExpression.parse("@hourly").minutes == {0} and CronExpression.parse("@daily").hours == {0}


@pytest.mark.parametrize(("text", "says"), [
    ("* * * *", "has 4 fields; it needs 5"),
    ("60 * * * *", "minute 60 is out of range (0-59)"),
    ("* * * * 1-8", "day of week 8 is out of range"),
    ("*/0 * * * *", "step '0' must be a positive number"),
    ("5-1 * * * *", "runs backwards"),
    ("0 0 ? * *", "'?' is not supported"),
    ("0 0 L * *", "'L' is not supported"),
    ("0 0 30 2 *", "never fires"),
    ("@reboot", "unknown cron macro"),
    ("x * * * *", "minute 'x' is not a number"),
])
def test_refusals_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(CronError, match=None) as err:
        CronExpression.parse(text)
    assert says in str(err.value)


def test_every_minute_and_latest() -> None:
    timing = Timing.of(schedule="*/5 * * * *")
    assert following(timing, at(2026, 1, 1, 10, 3, 20), 3) == [at(2026, 1, 1, 10, 5), at(2026, 1, 1, 10, 10),
                                                               at(2026, 1, 1, 10, 15)]
    assert timing.next_after(at(2026, 1, 1, 10, 5)) == at(2026, 1, 1, 10, 10), "strictly after"
    assert timing.latest_at_or_before(at(2026, 1, 1, 10, 5)) == at(2026, 1, 1, 10, 5), "at or before"
    assert timing.latest_at_or_before(at(2026, 1, 1, 10, 4, 59)) == at(2026, 1, 1, 10, 0)
    ticks, more = timing.ticks(at(2026, 1, 1, 10, 0), at(2026, 1, 1, 10, 30), 100)
    assert len(ticks) == 6 and not more
    ticks, more = timing.ticks(at(2026, 1, 1), at(2026, 1, 2), 10)
    assert len(ticks) == 10 and more


def test_day_fields_either_when_both_restricted() -> None:
    timing = Timing.of(schedule="0 12 13 * fri")  # the 13th, or any Friday (Vixie cron)
    days = [t.date() for t in following(timing, at(2026, 2, 1), 4)]
    assert days == [dt.date(2026, 2, 6), dt.date(2026, 2, 13), dt.date(2026, 2, 20), dt.date(2026, 2, 27)]
    leap = Timing.of(schedule="0 0 29 2 *")
    assert leap.next_after(at(2026, 1, 1)) == at(2028, 2, 29)


def test_time_zone_wall_clock() -> None:
    timing = Timing.of(schedule="0 9 * * *", time_zone="Europe/Berlin")
    assert timing.next_after(at(2026, 1, 10)) == at(2026, 1, 10, 8), "09:00 CET is 08:00 UTC in winter"
    assert timing.next_after(at(2026, 7, 10)) == at(2026, 7, 10, 7), "and 07:00 UTC in summer"


def test_spring_forward_a_skipped_wall_time_fires_once_when_the_clock_jumps() -> None:
    timing = Timing.of(schedule="30 2 * * *", time_zone="America/New_York")
    ticks = following(timing, at(2026, 3, 7, 12), 3)  # 2026-03-08: 02:00 EST -> 03:00 EDT
    local = [t.astimezone(timing.zone).strftime("%m-%d %H:%M") for t in ticks]
    assert local == ["03-08 03:30", "03-09 02:30", "03-10 02:30"]
    hourly = Timing.of(schedule="0,30 * * * *", time_zone="America/New_York")
    night = hourly.ticks(at(2026, 3, 8, 5), at(2026, 3, 8, 9), 100)[0]  # 00:00-05:00 local
    assert len(night) == len(set(night)), "no tick twice"
    assert [t.astimezone(hourly.zone).strftime("%H:%M") for t in night] == [
        "00:30", "01:00", "01:30", "03:00", "03:30", "04:00", "04:30", "05:00"]


def test_fall_back_a_repeated_wall_time_fires_once() -> None:
    timing = Timing.of(schedule="30 1 * * *", time_zone="America/New_York")
    ticks = timing.ticks(at(2026, 10, 31, 12), at(2026, 11, 2, 12), 100)[0]  # 2026-11-01: 01:00-02:00 twice
    assert ticks == [at(2026, 11, 1, 5, 30), at(2026, 11, 2, 6, 30)]
    assert timing.latest_at_or_before(at(2026, 11, 1, 6, 45)) == at(2026, 11, 1, 5, 30)


def test_every_is_anchored_to_the_epoch() -> None:
    timing = Timing.of(schedule=None, every="30s")
    assert timing.next_after(at(2026, 1, 1, 0, 0, 10)) == at(2026, 1, 1, 0, 0, 30)
    assert timing.latest_at_or_before(at(2026, 1, 1, 0, 0, 10)) == at(2026, 1, 1)
    assert parse_every("1h30m") == 5400 and parse_every("2d") == 172800 and parse_every("45") == 45
    for bad in ("", "5 minutes", "0s"):
        with pytest.raises(ValueError):
            parse_every(bad)
    with pytest.raises(ValueError, match="exactly one"):
        Timing.of(schedule="* * * * *", every="5m")
    with pytest.raises(ValueError, match="timeZone applies to a cron schedule"):
        Timing.of(schedule=None, every="5m", time_zone="UTC")
    with pytest.raises(ValueError, match="not an IANA time zone"):
        Timing.of(schedule="* * * * *", time_zone="Mars/Olympus")
    assert tick_name("nightly", at(2026, 1, 1)) == "nightly-1767225600"
