"""Named fault points for crash and interruption tests.

``DURABLE_SANDBOX_FAULT=<point>[@<n>][!<SIGNAL>]`` makes the process send itself ``SIGNAL`` (default
SIGKILL; SIGINT and SIGTERM play Ctrl-C and a shutdown) the n-th time (default first) it reaches
``<point>``; with ``<point>`` of the form ``before:<op>``/``inside:<op>``/``after:<op>`` the tests choose an
exact operation (sandbox calls: ``before:`` is sent just before the provider executes the call, so the
call is in flight when a catchable signal is handled). Deterministic, unlike racing a kill against a
timer, and free when unset.

``DURABLE_SANDBOX_PAUSE=<point>=<file>`` holds the task that reaches ``<point>`` (the first time, through
:func:`pause`) until ``<file>`` exists, creating ``<file>.reached`` as it stops there: a test waits for that
file, does what it races against the paused task (a Workflow's call against the idle timer), then creates
``<file>``. Only that task waits; the rest of the process goes on (it is an ``await``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path

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
_PAUSE = os.environ.get("DURABLE_SANDBOX_PAUSE") or None
_paused: set[str] = set()
PAUSE_LIMIT = 600.0  # a test that never lets go (it died) does not hold the operator for ever
_POLL = 0.05

log = logging.getLogger(__name__)


def reach(point: str) -> None:
    if _TARGET is None or point != _TARGET[0]:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] == _TARGET[1]:
        os.kill(os.getpid(), _TARGET[2])


async def pause(point: str) -> None:
    """Hold here the first time ``point`` is reached, if ``DURABLE_SANDBOX_PAUSE`` names it (see the module)."""
    if _PAUSE is None or point in _paused:
        return
    name, sep, file = _PAUSE.partition("=")
    if not sep or name != point or not file:
        return
    _paused.add(point)
    log.info("paused at fault point %s until %s exists", point, file)
    await asyncio.to_thread(_hold_until, Path(file))  # a thread waits: the event loop (every other task) goes on
    log.info("going on from fault point %s", point)


def _hold_until(gate: Path) -> None:
    Path(f"{gate}.reached").touch()
    deadline = time.monotonic() + PAUSE_LIMIT
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(_POLL)
