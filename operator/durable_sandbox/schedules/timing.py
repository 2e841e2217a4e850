"""When a schedule fires: a cron expression in a time zone, or every N seconds. Pure (no clock read here).

``every`` ticks fall on multiples of the period since the Unix epoch (UTC), so every process, replica or worker
computes the same ticks with no state; a tick's name is its Unix time in seconds (``<schedule>-<seconds>``), so a
tick made twice is the same object or run, never a second one.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from durable_sandbox.schedules.cron import CronError, CronExpression

__all__ = ["MIN_EVERY_SECONDS", "Timing", "parse_every", "tick_name"]

UTC = dt.UTC
MIN_EVERY_SECONDS: Final = 1
_EVERY = re.compile(r"^\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*$")
# The longest schedule name whose tick names still fit a label value (63): name + '-' + 10 digits.
NAME_MAX: Final = 52


def parse_every(text: str) -> int:
    """``30s``, ``5m``, ``1h30m``, ``2d`` (or plain seconds) -> seconds. ValueError saying what is wrong."""
    stripped = text.strip()
    if stripped.isdigit():
        seconds = int(stripped)
    else:
        match = _EVERY.match(stripped)
        if not stripped or match is None or not any(match.groups()):
            raise ValueError(f"every {text!r} is not a duration: write e.g. 30s, 5m, 1h30m or 2d")
        d, h, m, s = (int(g or 0) for g in match.groups())
        seconds = ((d * 24 + h) * 60 + m) * 60 + s
    if seconds < MIN_EVERY_SECONDS:
        raise ValueError(f"every {text!r} is shorter than {MIN_EVERY_SECONDS}s")
    return seconds


def zone_of(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"time zone {name!r} is not an IANA time zone name (e.g. Europe/Berlin, America/New_York, "
                         "UTC)") from None


def tick_name(schedule: str, tick: dt.datetime) -> str:
    """The name (Workflow) or run id (local store) of ``schedule``'s tick at ``tick``: the same for every maker."""
    return f"{schedule}-{int(tick.timestamp())}"


@dataclass(frozen=True)
class Timing:
    """Exactly one of ``cron`` (with ``zone``) or ``every`` (seconds)."""

    cron: CronExpression | None = None
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    every: int | None = None

    @classmethod
    def of(cls, *, schedule: str | None, time_zone: str | None = None, every: str | int | None = None) -> Timing:
        if (schedule is None) == (every is None):
            raise ValueError("give exactly one of a cron schedule or every")
        if every is not None:
            if time_zone is not None:
                raise ValueError("timeZone applies to a cron schedule, not to every")
            return cls(every=every if isinstance(every, int) else parse_every(every))
        assert schedule is not None
        try:
            cron = CronExpression.parse(schedule)
        except CronError as exc:
            raise ValueError(str(exc)) from None
        return cls(cron=cron, zone=zone_of(time_zone or "UTC"))

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        if self.cron is not None:
            return self.cron.next_after(instant, self.zone)
        assert self.every is not None
        return dt.datetime.fromtimestamp((int(instant.timestamp()) // self.every + 1) * self.every, UTC)

    def latest_at_or_before(self, instant: dt.datetime) -> dt.datetime | None:
        if self.cron is not None:
            return self.cron.latest_at_or_before(instant, self.zone)
        assert self.every is not None
        return dt.datetime.fromtimestamp(int(instant.timestamp()) // self.every * self.every, UTC)

    def ticks(self, after: dt.datetime, until: dt.datetime, limit: int) -> tuple[list[dt.datetime], bool]:
        """The ticks in (after, until], at most ``limit`` of the earliest; True when there were more."""
        out: list[dt.datetime] = []
        tick = self.next_after(after)
        while tick <= until:
            if len(out) == limit:
                return out, True
            out.append(tick)
            tick = self.next_after(tick)
        return out, False
