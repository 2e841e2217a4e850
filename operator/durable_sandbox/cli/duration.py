"""Durations on the command line: ``90s``, ``10m``, ``12h``, ``7d``, ``1h30m``, ``2w``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from durable_sandbox.runs.errors import CliError

_UNITS: Final[Mapping[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str, option: str) -> float:
    """Seconds in ``text``: one or more <number><unit> parts, units s m h d w (as in kubectl and Argo)."""
    compact = text.strip().lower()
    parts = _PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise CliError(f"{option} {text!r} is not a duration; write e.g. 90s, 10m, 12h, 7d or 1h30m")
    return sum(float(n) * _UNITS[u] for n, u in parts)
