"""The worker: ``dsb worker --kube --queue QUEUE [--namespace NS]``.

It executes the runs of the Workflows of one namespace whose ``spec.worker.queue`` is its queue, with its own
credentials (the namespace's ServiceAccount: it reads Workflows and writes the namespace's Journal objects) and
the namespace's worker key (``kube/journal/worker_key.py``): it never holds the operator's journal key, and what
it seals opens in its own namespace only. The operator admits each run (creates it in the journal) before a
worker sees it; a worker creates nothing, and executes only what the run driver says is due (``decide``: pending,
orphaned, a due timer, a retry due, a cancel to carry out).

Executions use the operator's store (``KubernetesStore``) and executor unchanged: one executor at a time by the
run's Lease and its fence, a worker killed mid-run is taken over by another once its Lease runs out (its
committed steps replayed, never re-run), and SIGTERM hands every run over at its next step boundary. While a run
executes, the worker looks at its Workflow every ``poll`` seconds: ``spec.suspend`` hands it over (the operator
then suspends it), a cancel (``spec.cancel``, the deadline, deletion, which the operator writes to the journal)
is carried out here. Its heartbeat Lease (``kube/journal/worker_liveness.py``) tells the operator that the queue
has a worker, which it says in the ``WaitingForWorker`` condition and for nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from durable_sandbox.engine import LeaseHeld, NotRunnableHere, RunRecord
from durable_sandbox.engine.builds import WorkerBuild, refusal
from durable_sandbox.engine.driver import decide
from durable_sandbox.engine.observed_store import observer_of
from durable_sandbox.kube.api.objects import owner_tag
from durable_sandbox.kube.api.resources import WORKFLOWS, CustomObjects
from durable_sandbox.kube.journal.worker_liveness import Heartbeat
from durable_sandbox.kube.spec.models import WorkflowResource, without_refused_signals
from durable_sandbox.kube.spec.plan import (
    PlanError,
    RunPlan,
    WorkflowUnavailable,
    cluster_run_id,
    plan_workflow,
)
from durable_sandbox.sandbox_engine import Engine

log = logging.getLogger("durable_sandbox.kube.workers")

__all__ = ["KubeWorker", "queued_on"]


def queued_on(body: Mapping[str, Any], queue: str) -> bool:
    """Whether the Workflow ``body`` names ``queue`` in spec.worker (and is not being deleted)."""
    worker = (body.get("spec") or {}).get("worker")
    return isinstance(worker, dict) and worker.get("queue") == queue and not body["metadata"].get("deletionTimestamp")


@dataclass
class KubeWorker:
    """One worker process's loop over its namespace's queued runs. ``engine`` is over the namespace's
    ``KubernetesStore`` opened with the worker key; ``objects`` reads Workflows with the worker's credentials."""

    engine: Engine
    objects: CustomObjects
    heartbeat: Heartbeat
    concurrency: int = 4
    poll: float = 1.0
    grace: float = 20.0  # SIGTERM: how long a step in flight may take to finish before it is abandoned
    executing: dict[str, asyncio.Task[Any]] = field(default_factory=dict)  # run id -> its execution here
    executed: list[str] = field(default_factory=list)
    owners: dict[str, str] = field(default_factory=dict)  # run id -> owner tag of its sandboxes
    said_pinned: set[str] = field(default_factory=set)  # runs of another build this worker said it leaves alone

    @property
    def namespace(self) -> str:
        return self.heartbeat.namespace

    @property
    def queue(self) -> str:
        return self.heartbeat.queue

    def owner_of(self, run_id: str) -> str | None:
        """The owner tag of a run's sandboxes (``<namespace>/<Workflow uid>``): the operator's cleanup finds them by it."""
        return self.owners.get(run_id)

    async def serve(self, stop: asyncio.Event, *, until_idle: bool = False) -> list[str]:
        """Until ``stop`` (SIGTERM: every run is handed over at its next boundary) or, ``until_idle``, until
        nothing of the queue is due; the runs it executed."""
        try:
            while not stop.is_set():
                await self.heartbeat.beat()
                workflows = [b for b in await self.objects.list(WORKFLOWS, self.namespace) if queued_on(b, self.queue)]
                started = await self._look(workflows)
                await self._steer(workflows)
                if until_idle and not started and not self.executing:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll)
        finally:
            await self._hand_over_all()
            with contextlib.suppress(Exception):
                await self.heartbeat.stop()
        return self.executed

    async def _look(self, workflows: Sequence[Mapping[str, Any]]) -> int:
        """Start executing the due runs among ``workflows`` (as many as ``concurrency`` allows)."""
        for run_id, task in list(self.executing.items()):
            if task.done():
                del self.executing[run_id]
        started = 0
        for body in workflows:
            if len(self.executing) >= self.concurrency:
                break
            plan = self._plan(body)
            if plan is None or plan.run_id is None or plan.run_id in self.executing:
                continue
            run = await self.engine.store.get_run(plan.run_id)
            if run is None:
                continue  # not admitted by the operator yet
            suspend = bool((body.get("spec") or {}).get("suspend"))
            if decide(run, plan.policy, time.time(), suspend=suspend).kind != "execute" or self._pinned(run, plan):
                continue
            self.owners[plan.run_id] = owner_tag(self.namespace, body["metadata"]["uid"])
            self.executing[plan.run_id] = asyncio.create_task(self._execute(plan), name=f"worker:{plan.run_id}")
            started += 1
        return started

    def _pinned(self, run: RunRecord, plan: RunPlan) -> bool:
        """Whether the run is another build's (engine/builds.py): left alone, never claimed, said once."""
        why = refusal(run, plan.definition, self.engine.extensions.get(WorkerBuild))
        if why is None:
            self.said_pinned.discard(run.run_id)
            return False
        if run.run_id not in self.said_pinned:
            self.said_pinned.add(run.run_id)
            log.warning("worker %s leaves alone: %s", self.engine.worker_id, why)
            observer = observer_of(self.engine.store)
            if observer is not None:
                observer.skipped_pinned()
        return True

    def _plan(self, body: Mapping[str, Any]) -> RunPlan | None:
        """The run plan with the workflow imported here; None (said) when it cannot be."""
        name = body["metadata"]["name"]
        try:
            wf = WorkflowResource.model_validate(without_refused_signals(dict(body))[0])
            return plan_workflow(wf, source=self.namespace, cluster=True, executing_worker=True)
        except (ValidationError, PlanError, WorkflowUnavailable) as exc:
            log.warning("Workflow %s/%s is not runnable by this worker: %s", self.namespace, name, exc)
            return None

    async def _execute(self, plan: RunPlan) -> None:
        assert plan.run_id is not None
        try:
            await self.engine.executor.drive(plan.run_id, plan.definition, if_busy="skip")
            self.executed.append(plan.run_id)
        except LeaseHeld:
            pass  # another worker (or the operator, cancelling it) holds the run
        except NotRunnableHere as exc:
            log.warning("run %s is not runnable here: %s", plan.run_id, exc)
        except Exception:
            log.exception("worker %s failed executing run %s", self.engine.worker_id, plan.run_id)

    async def _steer(self, workflows: Sequence[Mapping[str, Any]]) -> None:
        """What happened to the Workflows of the runs executing here: suspend hands a run over, a cancel the
        operator wrote to the journal is carried out here, a Workflow gone (or no longer on this queue) too."""
        bodies = {cluster_run_id(b["metadata"]["name"], b["metadata"]["uid"]): b for b in workflows}
        executor = self.engine.executor
        for run_id in list(self.executing):
            body = bodies.get(run_id)
            if body is not None and (body.get("spec") or {}).get("suspend"):
                executor.hand_over(run_id, "spec.suspend is true")
                continue
            run = await self.engine.store.get_run(run_id)
            reason = run.cancel_requested if run is not None and run.cancel_requested else None
            if reason is None and body is None:
                reason = "the Workflow was deleted"
            if reason is not None:
                await executor.cancel_here(run_id, reason)

    async def _hand_over_all(self) -> None:
        tasks = [t for t in self.executing.values() if not t.done()]
        for run_id in list(self.executing):
            self.engine.executor.hand_over(run_id, "the worker is stopping")
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.grace)
            for task in pending:  # a step that outlasts the grace runs again, same operation id, elsewhere
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self.executing.clear()
