"""A wall clock tests move instead of waiting: for TTLs, timers, leases and backoffs (no sleeps standing in for
time). The ``clock`` fixture (tests/conftest.py) installs one in the modules that read the time."""

from __future__ import annotations

import time

_real_time = time.time

__all__ = ["Clock"]


class Clock:
    """Wall clock seen by the engine context, runtime and SqliteStore: real time plus an offset."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return _real_time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
