"""Queued runs: the turn of a run that the namespace's own workers execute (``spec.worker``), not this operator.

The operator keeps what must not depend on user code: admission (the run is created here, under the entrypoint's
name, nothing imported: ``kube/spec/queued.py``), steering (signals, cancel, suspend, the deadline), status and
Events, and the finalizer. Where it would execute the run, it instead

- hands the namespace its worker key (``kube/journal/worker_key.py``), with which the workers seal the journal;
- projects status from the journal the workers commit (it reads what was committed since it last looked);
- says whether a worker of the queue is alive (the ``WaitingForWorker`` condition), from the workers'
  heartbeat Leases (``kube/journal/worker_liveness.py``): a notice only, never a decision;
- leaves a cancel (``spec.cancel``, ``spec.timeoutSeconds``, written to the journal by steering) to the worker
  that executes the run next: finalizing sandboxes from a journal the team's code wrote would let that code name
  what the operator deletes. Deleting the Workflow needs no worker: the finalizer goes by the providers' owner
  tags (``kube/workflow/cleanup.py``);

and looks again every ``worker_poll`` seconds while the run is runnable (a watch event wakes it sooner).
"""

from __future__ import annotations

import logging
import time

from durable_sandbox.engine import RunRecord
from durable_sandbox.engine.builds import WorkerBuild, pinned_build
from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.journal.worker_key import WorkerKeyError, ensure_worker_key
from durable_sandbox.kube.journal.worker_liveness import live_builds
from durable_sandbox.kube.spec.plan import RunPlan
from durable_sandbox.kube.workflow.parking import Outcome, wait_or_park
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.sandbox_engine import Engine

log = logging.getLogger(__name__)

__all__ = ["KEY_CHECK_EVERY", "QueuedRuns", "no_build_message", "no_worker_message"]

KEY_CHECK_EVERY = 60.0  # seconds: a worker key deleted or changed behind the operator's back is put back within this


def no_worker_message(namespace: str, queue: str) -> str:
    return (f"no worker of queue {queue!r} is alive in namespace {namespace}: the run starts once one claims it "
            f"(dsb worker --kube --queue {queue} --namespace {namespace}, with a ServiceAccount of {namespace})")


def no_build_message(run: RunRecord | None, queue: str, alive: dict[str, str | None]) -> str | None:
    """What a run pinned to a build no live worker of the queue runs waits for (None: one does, or it is not
    pinned). Said only: the build is what a worker recorded, the workflow's versioning is in the team's code."""
    pinned = pinned_build(run) if run is not None and not run.status.terminal else None
    if pinned is None or pinned in alive.values():
        return None
    try:
        WorkerBuild(pinned)
    except ValueError:
        pinned = "(an unreadable build id)"
    builds = ", ".join(sorted({b or "unversioned" for b in alive.values()}))
    return (f"the run is pinned to build {pinned!r} and the live workers of queue {queue!r} run {builds}: it waits "
            f"for a worker of build {pinned!r}, unless its workflow is versioning='auto-upgrade' (then a newer "
            f"worker takes it over at its next execution)")


class QueuedRuns:
    def __init__(self, wing: Wing, api: KubeClient, journal_key: bytes | None) -> None:
        self.wing = wing
        self.api = api
        self._journal_key = journal_key
        # namespace -> when this process last wrote or found its worker key right (looked at again after KEY_CHECK_EVERY)
        self._keyed: dict[str, float] = {}

    async def refresh(self, view: RunView, engine: Engine, plan: RunPlan) -> None:
        """Bring what the workers committed to status (every turn of a queued run, whatever its state): the
        journal since the last look, and whether a worker of the queue is alive."""
        assert plan.worker_queue is not None
        await self._hand_key(view)
        if view.projection is not None:
            view.projection.catch_up(await engine.store.journal_since(view.run_id, view.projection.last_seq))
        alive = await live_builds(self.api, view.namespace, plan.worker_queue)
        view.extra.worker_queue = plan.worker_queue
        view.extra.no_worker = (no_worker_message(view.namespace, plan.worker_queue) if not alive
                                else no_build_message(view.run, plan.worker_queue, alive))
        self.wing.publisher.offer(view)

    async def watch(self, view: RunView) -> Outcome:
        """A runnable queued run (refreshed by this turn): look again in ``worker_poll`` seconds (or sooner)."""
        await wait_or_park(self.wing.runs, self.wing.settings, view, self.wing.settings.worker_poll, "worker")
        return "again"

    async def _hand_key(self, view: RunView) -> None:
        if self._journal_key is None:
            return  # no seals (the PostgreSQL journal): nothing to hand
        if time.monotonic() - self._keyed.get(view.namespace, -KEY_CHECK_EVERY) < KEY_CHECK_EVERY:
            return
        try:
            await ensure_worker_key(self.api, view.namespace, self._journal_key)
        except WorkerKeyError as exc:
            log.warning("%s/%s: %s", view.namespace, view.name, exc)
            view.extra.not_runnable, view.extra.not_runnable_reason = str(exc), "WorkerKeyNotWritten"
            return
        self._keyed[view.namespace] = time.monotonic()
        if view.extra.not_runnable_reason == "WorkerKeyNotWritten":
            view.extra.not_runnable, view.extra.not_runnable_reason = None, None
