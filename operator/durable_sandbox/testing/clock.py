"""A wall clock tests move instead of waiting: TTLs, timers, leases and backoffs pass without sleeping."""

from __future__ import annotations

import asyncio
import importlib
import time
import types
from typing import Protocol

__all__ = ["FakeClock", "SteppedClock"]

_real_time = time.time

# The modules whose ``time`` is the engine's wall clock: steps (retry backoff, cache expiry), waits (timers,
# callback deadlines), the run driver (deadlines, retry backoff), the executor (leases, hibernation) and
# SqliteStore (cache expiry, due runs).
CLOCKED_MODULES = (
    "durable_sandbox.engine.steps",
    "durable_sandbox.engine.waits",
    "durable_sandbox.engine.driver",
    "durable_sandbox.engine.executor",
    "durable_sandbox.stores.sqlite_file",
)


class Patcher(Protocol):
    """What ``install`` needs to swap a module attribute and put it back (``pytest.MonkeyPatch`` is one)."""

    def setattr(self, target: object, name: str, value: object) -> None: ...


class FakeClock:
    """The engine's wall clock as real time plus an offset that the test moves (``advance``), or, given ``start``,
    a clock that stands still at ``start`` until the test moves it.

    ``install(monkeypatch)`` makes it the clock of the engine and of SqliteStore for one test; monotonic time,
    ``sleep`` and ``perf_counter`` stay real, so nothing waits on a clock that does not move by itself. Where a
    component takes its clock as a callable (providers, the session API's authorizer), pass the clock itself.
    """

    def __init__(self, start: float | None = None) -> None:
        self.start = start
        self.offset = 0.0

    def time(self) -> float:
        return (_real_time() if self.start is None else self.start) + self.offset

    def __call__(self) -> float:
        return self.time()

    @property
    def now(self) -> float:
        return self.time()

    @now.setter
    def now(self, value: float) -> None:
        """``clock.now += 60`` moves the clock (``advance(60)``)."""
        self.offset += value - self.time()

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def install(self, patcher: Patcher) -> FakeClock:
        fake = types.SimpleNamespace(time=self.time, monotonic=time.monotonic, sleep=time.sleep,
                                     perf_counter=time.perf_counter)
        for name in CLOCKED_MODULES:
            patcher.setattr(importlib.import_module(name), "time", fake)
        return self


class SteppedClock:
    """Monotonic and wall time that move only when the code under test sleeps on it: a ``LeaseClock``
    (engine/lease_keeper.py) whose renewals, backoffs and deadlines pass at once, in the order they would."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t

    async def sleep(self, seconds: float) -> None:
        assert seconds >= 0, f"the keeper asked to sleep {seconds}s"
        self.slept.append(seconds)
        self.t += seconds
        await asyncio.sleep(0)
