"""The one test clock (``durable_sandbox.testing.FakeClock``): as the engine's wall clock, and as the callable
clock providers and the session API's authorizer take."""

from __future__ import annotations

import time

from durable_sandbox.testing import FakeClock


def test_a_started_clock_stands_still_until_moved() -> None:
    clock = FakeClock(start=1_000.0)
    assert clock() == clock.now == clock.time() == 1_000.0
    clock.advance(5)
    clock.now += 10
    assert clock() == 1_015.0


def test_an_unstarted_clock_is_real_time_plus_what_the_test_moved() -> None:
    clock = FakeClock()
    before = time.time()
    clock.advance(3600)
    assert before + 3600 <= clock() <= time.time() + 3600
