"""Named fault points for crash tests.

``DURABLE_SANDBOX_FAULT=<point>[@<n>]`` makes the process SIGKILL itself the n-th time (default first)
it reaches ``<point>``; with ``<point>`` of the form ``before:<op>``/``inside:<op>``/``after:<op>`` the
tests choose an exact operation. Deterministic, unlike racing a kill against a timer, and free when unset.
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("DURABLE_SANDBOX_FAULT") or None
_counts: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int]:
    point, _, nth = spec.rpartition("@")
    if point and nth.isdigit():
        return point, int(nth)
    return spec, 1


_TARGET = _parse(_SPEC) if _SPEC else None


def reach(point: str) -> None:
    if _TARGET is None or point != _TARGET[0]:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] == _TARGET[1]:
        os.kill(os.getpid(), signal.SIGKILL)
