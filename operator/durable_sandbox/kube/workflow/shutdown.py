"""Shutdown (SIGTERM, a rolling update): every run executing here is handed over at a call boundary, never
finalized; its lease is released, so another replica re-attaches to the same live sandbox at once."""

from __future__ import annotations

import asyncio

from durable_sandbox.kube.workflow.runs import Runs
from durable_sandbox.kube.workflow.scheduler import Scheduler
from durable_sandbox.kube.workflow.settings import OperatorSettings

__all__ = ["shutdown"]

LATE_GRACE = 30.0  # seconds the runs still running after shutdown_grace get to end once cancelled


async def shutdown(runs: Runs, scheduler: Scheduler, settings: OperatorSettings) -> None:
    """Hand every run executing here over and wait for the active tasks (``shutdown_grace``, then cancelled)."""
    runs.stopping = True
    runs.stopped.set()
    for run_id in list(runs.parked):
        scheduler.unpark(run_id)
    for view in list(runs.views.values()):
        view.wake.set()
    for engine in runs.engines.values():
        for run_id in list(runs.views):
            engine.executor.hand_over(run_id, "the operator replica is stopping")
    # Each active run stops at its next call boundary (a call that outlasts handover_grace is abandoned
    # and runs again elsewhere with the same operation id); what is still running then is cancelled.
    tasks = list(runs.active.values())
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=settings.shutdown_grace)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=LATE_GRACE)
