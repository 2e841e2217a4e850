"""Execution: the run executed here, under its Lease, in one of this replica's execution slots.

Before claiming, a replica waits in proportion to the runs it executes already (claim spreading: the idler
replica wins); the slot is taken before the Lease, so a run queued here stays free for a replica with room
(``kube/workflow/concurrency.py``); the Workflow is read afresh just before the claim (a lagging watch must not let
this replica execute past a ``spec.suspend`` it has not seen). While the run executes, this task keeps
watching its Workflow and brings to the run what happens meanwhile:

- a spec change: signals and cancel reach the store (``kube/workflow/steering.py``), ``spec.suspend`` hands
  the run over at its next call boundary, and status.observedGeneration says the change is acted on;
- deletion: the run is cancelled here at once (its cleanup runs in this task, for at most
  ``handover_grace``; then the delete handler takes it over);
- the replica stopping (SIGTERM): the run is handed over at its next call boundary, to another replica;
- ``spec.timeoutSeconds`` passing: the run is cancelled (the deadline comes from the run driver's policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from durable_sandbox.engine import LeaseHeld, NotRunnableHere, RunStatus
from durable_sandbox.engine.errors import RunNotFound, StoreUnavailable
from durable_sandbox.kube.api.client import brief, is_transient
from durable_sandbox.kube.api.resources import WORKFLOWS
from durable_sandbox.kube.spec.plan import RunPlan
from durable_sandbox.kube.workflow.concurrency import (
    CONCURRENCY_LIMIT_REASON,
    RunSlots,
    concurrency_limit_condition,
)
from durable_sandbox.kube.workflow.parking import Outcome, Park, wait_or_park
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.steering import sync_spec
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.sandbox_engine import Engine

log = logging.getLogger(__name__)

__all__ = ["Execution"]

Fresh = Literal["unchanged", "changed", "gone"]


@dataclass
class _Executing:
    """One execution of a run in this task, from the slot to the end."""

    view: RunView
    engine: Engine
    plan: RunPlan
    deadline: float | None
    task: asyncio.Task[Any] = field(init=False)
    slot: asyncio.Event = field(default_factory=asyncio.Event)  # set once the run holds an execution slot
    handed_over: bool = False
    given_up_at: float | None = None  # deleted: when the cleanup in this task is cut short (monotonic)

    def timeout(self) -> float | None:
        """How long to watch before something is due (the deadline, the end of the cleanup's grace)."""
        timeout = max(0.0, self.deadline - time.time()) if self.deadline is not None else None
        if self.given_up_at is not None:
            left = max(0.0, self.given_up_at - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        return timeout


class Execution:
    def __init__(self, wing: Wing, slots: RunSlots) -> None:
        self.wing = wing
        self.runs, self.settings, self.publisher = wing.runs, wing.settings, wing.publisher
        self.slots = slots

    @property
    def _stopping(self) -> bool:
        return self.runs.stopped.is_set() or self.runs.stopping

    async def drive(self, view: RunView, engine: Engine, plan: RunPlan,
                    deadline: float | None) -> Outcome:
        """Execute the run here if its lease is free; meanwhile keep the spec flowing to it."""
        delay = self.claim_delay()
        if delay > 0:
            await wait_or_park(self.runs, self.settings, view, delay, "claim")
            if view.wake.is_set() or self._stopping or view.deleting:
                return "again"
        view.executing = True
        ex = _Executing(view, engine, plan, deadline)
        ex.task = asyncio.create_task(self._in_slot(ex))
        try:
            while not ex.task.done():
                await self._until_something(ex)
                if ex.task.done():
                    break
                outcome = await self._react(ex)
                if outcome is not None:
                    return outcome
            return await self._ended(ex)
        finally:
            if not ex.task.done():
                ex.task.cancel()
                with contextlib.suppress(BaseException):
                    await ex.task

    async def _in_slot(self, ex: _Executing) -> Any:
        view = ex.view
        # The slot is taken before the Lease is claimed, so a run queued here stays free for a
        # replica with room (kube/workflow/concurrency.py).
        async with self.slots.slot(view.run_id, on_wait=lambda: self._queued(view)):
            ex.slot.set()
            self._dequeued(view)
            fresh = await self._fresh_spec(view)
            if fresh != "unchanged":
                return fresh  # the daemon's next turn acts on the newer spec (suspend, cancel, deletion)
            executor = ex.engine.executor
            if executor.is_executing(view.run_id):
                # A child workflow's run executed by its parent's execution here (engine/children.py): wait for
                # that to end, then the next turn decides afresh (driving it now could retry a child that failed,
                # before its parent has recorded the failure; skipping would make the turns spin).
                await executor.here.idle(view.run_id)
                return None
            return await executor.drive(view.run_id, ex.plan.definition, if_busy="skip")

    async def _until_something(self, ex: _Executing) -> None:
        """Until the execution ends, the Workflow changes, the replica stops, or something is due."""
        waiters = [ex.task, asyncio.ensure_future(ex.view.wake.wait()), asyncio.ensure_future(self.runs.stopped.wait())]
        try:
            await asyncio.wait(waiters, timeout=ex.timeout(), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters[1:]:
                w.cancel()

    async def _react(self, ex: _Executing) -> Outcome | None:
        """What happened while the run executes, brought to it; an outcome ends the execution here."""
        view, executor = ex.view, ex.engine.executor
        if ex.given_up_at is not None and time.monotonic() >= ex.given_up_at:
            # The provider still refuses the cleanup: the delete handler takes it over (with its
            # backoff and the CleanupBlocked condition) once this task has stopped.
            ex.task.cancel()
            with contextlib.suppress(BaseException):
                await ex.task
            return "again"
        if not ex.slot.is_set():
            # Still queued for a slot: nothing executes, so a spec change, deletion, stop or
            # deadline is judged afresh by the daemon's next turn (which queues again if needed).
            ex.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ex.task
            self._dequeued(view)
            view.executing = False
            return "again"
        if view.deleting and not view.cancel_sent:
            # Deleted mid-run: cancel now (cleanup runs here, at once) rather than hand the run over.
            await ex.engine.client.request_cancel(view.run_id, "the Workflow was deleted")
            view.cancel_sent = True
            ex.given_up_at = time.monotonic() + self.settings.handover_grace
            await executor.cancel_here(view.run_id, "the Workflow was deleted")
        elif self._stopping:
            if not ex.handed_over:
                executor.hand_over(view.run_id, "the operator replica is stopping")
                ex.handed_over = True
                await self._finish_handover(ex.task)
        elif ex.deadline is not None and time.time() >= ex.deadline:
            await ex.engine.client.request_cancel(view.run_id, ex.plan.policy.timeout_reason)
            await executor.cancel_here(view.run_id, "timeout")
        elif view.wake.is_set():
            await self._spec_changed(ex)
        return None

    async def _spec_changed(self, ex: _Executing) -> None:
        view, executor = ex.view, ex.engine.executor
        view.wake.clear()
        generation = view.latest().get("metadata", {}).get("generation")
        try:
            wf = await sync_spec(view, ex.engine, self.publisher)
            run = await ex.engine.store.get_run(view.run_id)
        except Exception as exc:
            if not (is_transient(exc) or isinstance(exc, StoreUnavailable)):
                raise
            # The API server is away: the run goes on here; bring the spec to it once it answers.
            if not self.wing.away.unreachable(exc, f"applying the spec change of {view.namespace}/{view.name}"):
                log.warning("%s/%s: the journal's store could not be reached (%s); the spec change is applied "
                            "once it answers", view.namespace, view.name, brief(exc))
            await asyncio.wait([ex.task], timeout=self.settings.claim_retry)
            view.wake.set()
            return
        # This generation is acted on by the replica executing the run: status.observedGeneration
        # says so at once, so whoever changed the spec can tell that the run will stop (suspend) or
        # has its signal from here on, not only after the run ends. Also stops status-only watch
        # events from waking this loop again (they carry the same generation).
        view.generation = view.extra.generation = generation
        cancel = run.cancel_requested if run is not None and run.cancel_requested else None
        if cancel is None and wf is not None and wf.spec.suspend and not ex.handed_over:
            executor.hand_over(view.run_id, "spec.suspend is true")
            ex.handed_over = True
        self.publisher.offer(view)
        if cancel is not None:
            await executor.cancel_here(view.run_id, cancel)

    async def _ended(self, ex: _Executing) -> Outcome:
        """The execution here is over: what the daemon does next."""
        view = ex.view
        if ex.task.cancelled():
            return "again"  # abandoned after the handover grace: the run was left pending
        try:
            if ex.task.result() == "gone":
                return "done"  # deleted (its finalizer is gone too) or replaced by a new object
        except LeaseHeld as held:
            # Another replica executes it. Park until its Lease could have expired (a dead holder's run
            # is then taken over) or until the holder's status phase changes (handed over, finished).
            view.executing = False
            jitter = random.uniform(0.0, self.settings.claim_retry)
            raise Park(min(max(held.remaining, self.settings.claim_retry), self.settings.lease_ttl) + jitter,
                       "held") from None
        except RunNotFound:
            # The run vanished while executing here (deleted behind the operator's back, the Workflow still
            # there): the next turn finds it gone and says so (JournalLost), starting nothing afresh.
            view.executing = False
            return "again"
        except NotRunnableHere as exc:
            view.executing = False
            view.extra.not_runnable = str(exc)
            self.publisher.offer(view)
            await wait_or_park(self.runs, self.settings, view, self.settings.not_runnable_retry, "not-runnable")
        return "again"

    async def _fresh_spec(self, view: RunView) -> Fresh:
        """Read the Workflow afresh just before its run is claimed and executed here: is the spec still the
        one this turn judged? The watch may lag (after an API server restart it reconnects, and may re-list,
        seconds later): a replica taking over the run of one that died must not execute calls after a
        ``spec.suspend`` it has not seen yet, which the old holder had already acknowledged in
        status.observedGeneration. One GET per claim; a newer body wakes the daemon (``view.notice``)."""
        fresh = await self.wing.objects.get(WORKFLOWS, view.namespace, view.name)
        if fresh is None or fresh.get("metadata", {}).get("uid") != view.uid:
            return "gone"
        meta = fresh.get("metadata", {})
        if meta.get("generation") == view.generation and not meta.get("deletionTimestamp"):
            return "unchanged"
        view.notice(fresh)
        return "changed"

    def claim_delay(self) -> float:
        """How long to wait before claiming a run: longer the more runs this replica executes (or queues for
        an execution slot) already, so an idler replica wins the claim (with jitter, so two equally busy
        replicas do not claim in lockstep)."""
        busy = len(self.slots.executing) + len(self.slots.waiting)
        if busy == 0:
            return 0.0
        return min(self.settings.claim_delay_max, busy * self.settings.claim_delay_per_run * random.uniform(0.5, 1.5))

    def _queued(self, view: RunView) -> None:
        """The run waits for an execution slot: Pending, with Ready=False reason ConcurrencyLimit."""
        if view.run is not None and view.run.status == RunStatus.RUNNING:
            return  # another replica executes it (or did, until its lease runs out): its status stands
        cond = concurrency_limit_condition(self.slots.limit, len(self.slots.waiting))
        view.extra.not_runnable, view.extra.not_runnable_reason = cond["message"], cond["reason"]
        self.publisher.offer(view)

    def _dequeued(self, view: RunView) -> None:
        if view.extra.not_runnable_reason == CONCURRENCY_LIMIT_REASON:
            view.extra.not_runnable, view.extra.not_runnable_reason = None, None
            self.publisher.offer(view)

    async def _finish_handover(self, task: asyncio.Task[Any]) -> None:
        """Let the operation in flight finish (it is committed), then the run stops at the boundary; a
        call that outlasts the grace period is abandoned (it runs again, same operation id, elsewhere)."""
        done, _ = await asyncio.wait([task], timeout=self.settings.handover_grace)
        if not done:
            task.cancel()
