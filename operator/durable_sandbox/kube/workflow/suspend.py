"""``spec.suspend: true`` on a run no replica executes: pause it between calls with no live sandbox.

(A run executing here is handed over at its next call boundary instead, see ``kube/workflow/execution.py``;
the next turn then suspends it here.)"""

from __future__ import annotations

import contextlib

from durable_sandbox.engine import LeaseHeld, RunStatus
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.sandbox_engine import Engine

__all__ = ["suspend"]


async def suspend(view: RunView, engine: Engine, *, hibernate: bool = True) -> bool:
    """Snapshot and destroy the run's sandboxes (hibernate) and mark it suspended, under its lease. False when
    its lease is held elsewhere. Not ``hibernate`` (a run the namespace's workers execute): marked only, its
    sandboxes left to its worker (the operator finalizes nothing from a journal a worker wrote)."""
    executor = engine.executor
    try:
        lease = await engine.store.claim(view.run_id, executor.worker_id, executor.lease_ttl)
    except LeaseHeld:
        return False  # executing elsewhere: that replica sees spec.suspend through its own watch
    try:
        run = await engine.store.get_run(view.run_id)
        if run is None or run.status.terminal:
            return True
        if executor.hooks is not None and hibernate:
            await executor.hooks.hibernate_run(executor, run, lease)
        view.extra.suspended = True
        await engine.store.update_run(view.run_id, {"status": RunStatus.SUSPENDED}, fence=lease.fence)
        return True
    finally:
        with contextlib.suppress(Exception):
            await engine.store.release(lease)
