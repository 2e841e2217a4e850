"""Named fault points for crash and interruption tests.

``DURABLE_SANDBOX_FAULT=<point>[@<n>][!<SIGNAL>]`` makes the process send itself ``SIGNAL`` (default
SIGKILL; SIGINT and SIGTERM play Ctrl-C and a shutdown) the n-th time (default first) it reaches
``<point>``; with ``<point>`` of the form ``before:<op>``/``inside:<op>``/``after:<op>`` the tests choose an
exact operation (sandbox calls: ``before:`` is sent just before the provider executes the call, so the
call is in flight when a catchable signal is handled). Deterministic, unlike racing a kill against a
timer, and free when unset.
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("DURABLE_SANDBOX_FAULT") or None
_counts: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int, signal.Signals]:
    spec, bang, name = spec.rpartition("!") if "!" in spec else (spec, "", "")
    sig = signal.Signals[name] if bang else signal.SIGKILL
    point, _, nth = spec.rpartition("@")
    if point and nth.isdigit():
        return point, int(nth), sig
    return spec, 1, sig


_TARGET = _parse(_SPEC) if _SPEC else None


def reach(point: str) -> None:
    if _TARGET is None or point != _TARGET[0]:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] == _TARGET[1]:
        os.kill(os.getpid(), _TARGET[2])
