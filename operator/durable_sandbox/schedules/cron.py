"""A 5-field cron expression (minute hour day-of-month month day-of-week) evaluated in a time zone.

Written here rather than taken from a library: ``croniter`` is unmaintained, and the maintained ones (``cronsim``)
each pick their own daylight-saving rule; ours is stated and tested (tests/unit/test_schedule_cron.py), it is a
hundred lines, and the package gains no dependency.

Syntax, as Vixie cron and Kubernetes CronJob take it: ``*``, ``N``, ``N-M``, ``*/S``, ``N-M/S``, ``N/S`` (from N to
the field's end), lists with ``,``; month and weekday names (``jan``..``dec``, ``sun``..``sat``); weekday 0 and 7
are Sunday; ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``), ``@hourly``. When
both day fields are restricted a day matches either (Vixie cron's rule). Not supported (refused, saying so):
``?``, ``L``, ``W``, ``#``, seconds fields.

Daylight saving: a wall time the zone skips that day (02:30 on a spring-forward night) fires when the clock
jumps (it is taken with the offset before the change: 03:30 local); a wall time that happens twice (fall back)
fires once, the first time. So every tick of the expression fires exactly once.
"""

from __future__ import annotations

import bisect
import datetime as dt
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from zoneinfo import ZoneInfo

__all__ = ["CronError", "CronExpression"]

UTC = dt.UTC
_MONTHS: Final = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS: Final = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MACROS: Final[Mapping[str, str]] = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
                  "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_FIELDS: Final = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
                  ("month", 1, 12, _MONTHS), ("day of week", 0, 7, _DAYS))
_MONTH_DAYS: Final = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # at most (February: leap years)
SEARCH_DAYS: Final = 366 * 8 + 2  # "0 0 29 2 *" fires once in 4 years, or 8 across a century's non-leap year


class CronError(ValueError):
    """A cron expression that cannot be read or never fires; the message says which field and why."""


def _value(text: str, low: int, high: int, names: Sequence[str], field: str) -> int:
    lowered = text.lower()
    if lowered in names:
        return names.index(lowered) + (1 if field == "month" else 0)
    if not text.isdigit():
        raise CronError(f"{field} {text!r} is not a number{' or a name' if names else ''} ({low}-{high})")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{field} {value} is out of range ({low}-{high})")
    return value


def _field(text: str, low: int, high: int, names: Sequence[str], field: str) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        span, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field} step {step_text!r} must be a positive number")
            step = int(step_text)
        if span == "*":
            first, last = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = _value(a, low, high, names, field), _value(b, low, high, names, field)
            if first > last:
                raise CronError(f"{field} range {span!r} runs backwards")
        else:
            first = _value(span, low, high, names, field)
            last = high if slash else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronExpression:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_star: bool
    weekday_star: bool

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        source = text.strip()
        expanded = _MACROS.get(source.lower(), source)
        if expanded.startswith("@"):
            raise CronError(f"unknown cron macro {source!r}: use one of {', '.join(sorted(_MACROS))}")
        parts = expanded.split()
        if len(parts) != 5:
            raise CronError(f"cron expression {source!r} has {len(parts)} fields; it needs 5: minute hour "
                            "day-of-month month day-of-week (e.g. '*/5 * * * *')")
        for part, (field, *_rest) in zip(parts, _FIELDS, strict=True):
            bad = sorted(set(part) & set("?LW#"))
            if bad:
                raise CronError(f"{field} {part!r}: {''.join(bad)!r} is not supported (5-field Vixie cron syntax)")
        sets = [_field(p, low, high, names, field) for p, (field, low, high, names) in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in sets[4])
        cron = cls(source, sets[0], sets[1], sets[2], sets[3], weekdays, parts[2].startswith("*"),
                   parts[4].startswith("*"))
        if cron.day_star or not cron.weekday_star or any(d <= _MONTH_DAYS[m - 1] for m in cron.months for d in cron.days):
            return cron
        raise CronError(f"cron expression {source!r} never fires: no month it names has those days")

    def day_matches(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        dom, dow = day.day in self.days, (day.isoweekday() % 7) in self.weekdays
        if not self.day_star and not self.weekday_star:
            return dom or dow
        return dom and dow

    @functools.cached_property
    def times(self) -> tuple[int, ...]:
        """The day's ticks as minutes after local midnight, in order."""
        return tuple(sorted(h * 60 + m for h in self.hours for m in self.minutes))

    def _on_day(self, day: dt.date, zone: ZoneInfo, instant: dt.datetime, after: bool) -> dt.datetime | None:
        """This day's first tick after ``instant`` (``after``), or its last tick at or before it. On a day without
        an offset change the ticks are local midnight plus each time (a bisection); on a change day each wall
        time is converted on its own: a skipped one is taken with the offset before the change, so it can land
        after a later wall time (hence sorted, equal ones once)."""
        times = self.times
        midnight = dt.datetime(day.year, day.month, day.day, tzinfo=zone)
        if midnight.utcoffset() == dt.datetime(day.year, day.month, day.day, 23, 59, tzinfo=zone).utcoffset():
            base = midnight.astimezone(UTC)
            minute = math.floor((instant - base).total_seconds() / 60)
            at = bisect.bisect_right(times, minute)
            chosen = at if after else at - 1
            return base + dt.timedelta(minutes=times[chosen]) if 0 <= chosen < len(times) else None
        instants = sorted({dt.datetime(day.year, day.month, day.day, t // 60, t % 60, tzinfo=zone, fold=0)
                           .astimezone(UTC) for t in times})
        at = bisect.bisect_right(instants, instant)
        chosen = at if after else at - 1
        return instants[chosen] if 0 <= chosen < len(instants) else None

    def _days(self, start: dt.date, step: int) -> Iterator[dt.date]:
        for i in range(SEARCH_DAYS):
            day = start + dt.timedelta(days=step * i)
            if self.day_matches(day):
                yield day

    def next_after(self, instant: dt.datetime, zone: ZoneInfo) -> dt.datetime:
        """The first tick strictly after ``instant`` (aware), in UTC."""
        start = instant.astimezone(zone).date() - dt.timedelta(days=1)
        for day in self._days(start, 1):
            tick = self._on_day(day, zone, instant, after=True)
            if tick is not None:
                return tick
        raise CronError(f"cron expression {self.text!r} does not fire within {SEARCH_DAYS} days of {instant}")

    def latest_at_or_before(self, instant: dt.datetime, zone: ZoneInfo) -> dt.datetime | None:
        """The last tick at or before ``instant`` (aware), in UTC; None when there is none in the search span."""
        start = instant.astimezone(zone).date() + dt.timedelta(days=1)
        for day in self._days(start, -1):
            tick = self._on_day(day, zone, instant, after=False)
            if tick is not None:
                return tick
        return None
