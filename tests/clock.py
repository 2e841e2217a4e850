"""A wall clock tests move instead of waiting: for TTLs, timers, leases and backoffs (no sleeps standing in for
time). The ``clock`` fixture (tests/conftest.py) installs one in the modules that read the time; the clock itself
is the public kit's (``durable_sandbox.testing.FakeClock``), so users' tests move the same clock ours do."""

from __future__ import annotations

from durable_sandbox.testing.clock import FakeClock as Clock

__all__ = ["Clock"]
