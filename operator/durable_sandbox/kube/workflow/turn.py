"""The turn: what an active run's task does, turn after turn, until the run is parked or over.

Each turn reads the newest Workflow, admits it once (``kube/workflow/admission.py``), brings its spec to the
run (``kube/workflow/steering.py``) and decides by the run's state: execute it here
(``kube/workflow/execution.py``), cancel it when ``spec.timeoutSeconds`` has passed, wait for a retry's
backoff, suspend it (``kube/workflow/suspend.py``) or resume it, hibernate a waiting run and wait for its
timer, or finish (``kube/workflow/finished.py``). Every wait longer than ``park_after`` parks the run
(``kube/workflow/parking.py``). An API server that cannot be reached is no fault of the run: the turn is
taken again after a short backoff, never a crash of the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from durable_sandbox.engine import LeaseHeld, RunStatus
from durable_sandbox.engine.driver import decide, time_out
from durable_sandbox.engine.errors import JournalDamaged, StoreRefused, StoreUnavailable
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.kube.api.client import brief, is_transient
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.reporting.oplog import about
from durable_sandbox.kube.reporting.status import TERMINAL_PHASES
from durable_sandbox.kube.spec.plan import RunPlan
from durable_sandbox.kube.workflow.admission import Admission
from durable_sandbox.kube.workflow.chain import move_on, next_in_chain
from durable_sandbox.kube.workflow.execution import Execution
from durable_sandbox.kube.workflow.finished import Finisher
from durable_sandbox.kube.workflow.parking import Outcome, Park, wait_or_park
from durable_sandbox.kube.workflow.queued_runs import QueuedRuns
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.steering import sync_spec
from durable_sandbox.kube.workflow.suspend import suspend
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.sandbox_engine import Engine

log = logging.getLogger(__name__)

__all__ = ["TRANSIENT_BACKOFF_MAX", "Turn", "acted_generation"]

TRANSIENT_BACKOFF_MAX = 8.0  # seconds between tries while the API server is unreachable
STORE_AWAY_SAY_EVERY = 60.0  # seconds between WARNINGs that a namespace's journal store does not answer


def acted_generation(view: RunView) -> int | None:
    """The generation this replica may write as status.observedGeneration at the start of a turn: the
    spec's, except while a ``spec.suspend`` waits for the run's lease (the replica executing the run
    acts on it, and says so itself; the turn moves it here once the run is suspended). Otherwise a
    replica that merely saw the suspend would tell the world it had taken effect."""
    spec, shown = view.body.get("spec") or {}, view.body.get("status") or {}
    settled = shown.get("phase") == "Suspended" or shown.get("phase") in TERMINAL_PHASES  # nothing left to stop
    if spec.get("suspend") and not settled and not view.extra.suspended:
        held = shown.get("observedGeneration")
        return held if isinstance(held, int) else None
    return view.generation


class Turn:
    def __init__(self, wing: Wing, admission: Admission, execution: Execution, finisher: Finisher,
                 queued: QueuedRuns) -> None:
        self.runs, self.settings, self.engines, self.publisher = wing.runs, wing.settings, wing.engines, wing.publisher
        self.away = wing.away
        self.admission = admission
        self.execution = execution
        self.finisher = finisher
        self.queued = queued  # runs the namespace's workers execute (spec.worker)
        self._admitting = asyncio.Semaphore(wing.settings.admissions)
        self._store_away_said: dict[str, float] = {}  # namespace -> when its journal's store away was said

    async def _wait(self, view: RunView, timeout: float | None, why: str) -> None:
        await wait_or_park(self.runs, self.settings, view, timeout, why)

    async def serve(self, view: RunView) -> Park | None:
        """Turn after turn until the run is parked (returned), finished for good or this replica stops (None)."""
        engine = self.engines.engine_for(view.namespace)
        plan: RunPlan | None = None
        failures = 0  # consecutive turns the API server could not be reached
        while not self.runs.stopped.is_set() and not self.runs.stopping and not view.deleting:
            view.latest()
            view.generation = view.body.get("metadata", {}).get("generation")
            view.wake.clear()
            view.extra.generation = acted_generation(view)
            pause: tuple[float, str] | None = None  # waited out below, outside the handlers: a wait may park
            try:
                if plan is None:
                    plan = await self._admitted(view)
                    if plan is None:
                        continue
                outcome = await self.step(view, engine, plan)
            except Park as park:
                return park
            except JournalDamaged as exc:
                # Changed behind the operator's back, damaged, or gone: never executed from. Final, with the
                # reason and the object in the Failed condition and a Warning Event; deleting the Workflow
                # cleans up by the providers' owner tags (kube/workflow/cleanup.py).
                log.warning("%s/%s: %s", view.namespace, view.name, exc)
                await self.admission.reject(view, exc.reason, str(exc))
                return Park(None, "rejected")
            except StoreRefused as exc:
                # A quota, a permission, a size limit: not the run's fault and not passing by itself. Say so
                # (Ready=False, an Event) and look again after not_runnable_retry; nothing more was recorded.
                log.warning("%s/%s: %s", view.namespace, view.name, exc)
                self.publisher.refused(view, "JournalWriteRefused", str(exc))
                pause = (self.settings.not_runnable_retry, "journal-refused")
            except Exception as exc:
                if not (is_transient(exc) or isinstance(exc, StoreUnavailable)):
                    raise
                # The API server is away (a restart, an overload): the run is not at fault and the daemon
                # must not crash (kopf would wait a minute before restarting it); look again shortly.
                failures += 1
                delay = min(self.settings.claim_retry * 2 ** (failures - 1), TRANSIENT_BACKOFF_MAX)
                # The API server away is said once for the whole operator (ApiServerAway); the journal's own store
                # (PostgreSQL) away, at most once a STORE_AWAY_SAY_EVERY per namespace.
                if not self.away.unreachable(exc, f"the run of {view.namespace}/{view.name}") and self._say_store_away(view):
                    log.warning("%s/%s: the journal's store could not be reached (%s); its runs try again with a "
                                "backoff of up to %gs", view.namespace, view.name, brief(exc), TRANSIENT_BACKOFF_MAX,
                                extra=about(view.namespace, view.name, view.run_id))
                pause = (delay, "api-unreachable")
            if pause is not None:
                try:
                    await self._wait(view, *pause)
                except Park as park:
                    return park
                continue
            failures = 0
            if outcome == "done":
                return None
        return None

    def _say_store_away(self, view: RunView) -> bool:
        now = time.monotonic()
        if now - self._store_away_said.get(view.namespace, -STORE_AWAY_SAY_EVERY) < STORE_AWAY_SAY_EVERY:
            return False
        self._store_away_said[view.namespace] = now
        return True

    async def _admitted(self, view: RunView) -> RunPlan | None:
        """The run's plan once admitted (at most ``admissions`` at once); None: look again (or park)."""
        async with self._admitting:
            plan = await self.admission.admit(view)
        if plan is None:
            if view.extra.rejected is not None:  # final until the spec changes
                raise Park(None, "rejected")
            await self._wait(view, self.settings.not_runnable_retry, "not-runnable")
            return None
        view.extra.policy = plan.policy
        self.publisher.republish(view)
        return plan

    async def step(self, view: RunView, engine: Engine, plan: RunPlan) -> Outcome:
        """One turn of the daemon: bring the spec to the run, then do the run driver's next step (execute,
        cancel at the deadline, wait for a backoff or a timer, suspend or resume, finish)."""
        wf = await sync_spec(view, engine, self.publisher)
        run = await engine.store.get_run(view.run_id)
        if run is None:
            if view.deleting:  # the run's objects went with the Workflow: nothing to drive
                return "done"
            # Admitted (its run was created or found) and now gone, while the Workflow stays: deleted behind the
            # operator's back. Starting afresh would run every committed call again: stop and say so.
            raise JournalDamaged(view.run_id, self.engines.journals.location(view.namespace, view.run_id),
                                 "the run's record disappeared while the Workflow exists", tampered=False, lost=True)
        if run.status.terminal and (nxt := await next_in_chain(engine.store, run)) is not None:
            move_on(self.runs, view, run, nxt)  # it continued as new: the Workflow goes on with the next run
            self.publisher.offer(view)
            return "again"
        view.run = run
        view.extra.attempt = run.epoch + 1
        if plan.worker_queue is not None:
            await self.queued.refresh(view, engine, plan)  # what its workers committed, to status
        policy = plan.policy
        step = decide(run, policy, time.time(), suspend=wf is not None and wf.spec.suspend)
        if step.kind == "timeout":
            await time_out(engine, run, policy)
            return "again"
        if step.kind in ("suspend", "suspended"):
            return await self._suspended(view, engine, run, hibernate=plan.worker_queue is None)
        if not run.status.terminal and not run.cancel_requested:
            view.extra.suspended = False
        if step.kind == "finished":
            return await self.finisher.finished(view, plan)
        if step.kind == "backoff":
            assert step.at is not None
            self.publisher.offer(view)  # the backoff as read now (its time from the run's own updated_at)
            await self._wait(view, step.at - time.time(), "backoff")
            return "again"
        if step.kind == "resume":
            await engine.store.update_run(view.run_id, {"status": RunStatus.PENDING})
            self.publisher.emit(view.body, LifecycleEvent("Resumed", "spec.suspend is false; resuming the run"))
            return "again"
        if step.kind == "wait":
            return await self._waiting(view, engine, plan, run, step.at)
        if plan.worker_queue is not None:
            return await self.queued.watch(view)
        return await self.execution.drive(view, engine, plan, step.deadline)

    async def _suspended(self, view: RunView, engine: Engine, run: RunRecord, *, hibernate: bool = True) -> Outcome:
        if run.status != RunStatus.SUSPENDED and not await suspend(view, engine, hibernate=hibernate):
            # Its lease is held: by a replica executing it (which stops at the next boundary), or by one
            # that died or was cut off from the API server (the lease expires). Look again shortly: waiting
            # for the next watch event could mean waiting forever.
            await self._wait(view, self.settings.claim_retry, "suspend-lease-held")
            return "again"
        view.extra.generation = view.generation  # suspended: the change has taken effect
        await self._wait(view, None, "suspended")
        return "again"

    async def _waiting(self, view: RunView, engine: Engine, plan: RunPlan, run: RunRecord,
                       due: float | None) -> Outcome:
        """A run waiting on a signal or a timer (``due``: its wake time or its deadline, whichever is first):
        its sandbox is hibernated once it has waited long enough, and the run is parked until then."""
        now = time.time()
        dues = [due] if due is not None else []
        hibernate_at = run.updated_at + self._hibernate_after(plan)
        if hibernate_at <= now and plan.worker_queue is None:  # a worker's sandboxes are its own to hibernate
            with contextlib.suppress(LeaseHeld):
                await engine.executor.hibernate(view.run_id)
        else:
            dues.append(hibernate_at)
        await self._wait(view, (min(dues) - now) if dues else None, "waiting")
        return "again"

    def _hibernate_after(self, plan: RunPlan) -> float:
        value = plan.input.get("hibernateAfterSeconds") if isinstance(plan.input, dict) else None
        return float(value) if value is not None else self.settings.hibernate_after
