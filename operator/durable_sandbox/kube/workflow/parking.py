"""Parking: a run with nothing to do for a while keeps no task, only a :class:`Parked` record.

A run's task raises :class:`Park` when the run waits longer than ``park_after`` (on a signal, a durable
timer, ``spec.suspend``, a retry backoff, a Sandbox, another replica's Lease, or it finished); the
scheduler (``kube/workflow/scheduler.py``) keeps the record and at most one timer handle, and the watch
event that can change the run's course, or the timer, makes it active again.
"""

from __future__ import annotations

from typing import Literal

from durable_sandbox.kube.workflow.runs import Runs, RunView
from durable_sandbox.kube.workflow.settings import OperatorSettings

__all__ = ["Outcome", "Park", "wait_or_park"]

# How a turn of a run's task ends: "again" (another turn), "done" (the task ends, nothing to park), or a
# Park raised (the task ends and the run is parked).
Outcome = Literal["again", "done"]


class Park(Exception):
    """Raised inside a run's task: the run has nothing to do for ``delay`` seconds (None: until a watch event)."""

    def __init__(self, delay: float | None, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


async def wait_or_park(runs: Runs, settings: OperatorSettings, view: RunView, timeout: float | None, why: str) -> None:
    """Wait for a watch event, the replica stopping, or ``timeout``; a longer wait than ``park_after``
    (or an open-ended one) parks the run instead: raises :class:`Park` and the run's task ends."""
    stopped = runs.stopped
    if not stopped.is_set() and not runs.stopping and (timeout is None or timeout > settings.park_after):
        raise Park(timeout, why)
    await view.wait(stopped, timeout)
