"""Publishing: a run's status and lifecycle Events, as projections of what its executor writes.

The executor writes through an :class:`~durable_sandbox.kube.workflow.observed.ObservedStore`, which reports
every commit and journal read here (:meth:`Publisher.observed`, :meth:`Publisher.read`); the rows are folded
into the run's :class:`~durable_sandbox.kube.reporting.status.Projection`, rendered as the status document and offered
to the run's :class:`~durable_sandbox.kube.reporting.status.StatusWriter` (coalesced to about one patch a second, at
once on a phase change). Only the replica executing a run writes its status and Events, so nothing is read
back for them. Writes that follow the clock rather than the work share a budget across every run of this
replica (``OperatorSettings.periodic_writes_per_s``).

The log says each step of a run's life in one INFO line of the ``durable_sandbox.kube.lifecycle`` logger, with
the Workflow and run (docs/operations.md "The operator's log"): admitted, started, provisioned, snapshot taken
and deleted, sandbox lost and recovered, waiting, suspended, resumed, retrying, finished (with the outcome and
the duration). A phase is said when it changes from the one the Workflow's status shows, so a run this replica
takes up again (a restart, a takeover, a parked run woken) is not said again; every other Event written here
(a refusal, a blocked cleanup) is a line at the Event's level.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from durable_sandbox.engine.continue_as_new import continued_to
from durable_sandbox.engine.driver import backoff
from durable_sandbox.engine.records import Commit, OperationRecord
from durable_sandbox.kube.api.apiserver_away import ApiServerAway, took
from durable_sandbox.kube.api.resources import WORKFLOWS, CustomObjects
from durable_sandbox.kube.reporting.chain_status import chain_status
from durable_sandbox.kube.reporting.events import (
    TERMINAL_REASONS,
    EventRecorder,
    LifecycleEvent,
    lifecycle_events,
    run_status_event,
    terminal_event,
)
from durable_sandbox.kube.reporting.oplog import LIFECYCLE_LOGGER, about
from durable_sandbox.kube.reporting.status import RETRYING, StatusWriter, render, retry_message
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.store import KubernetesStore
from durable_sandbox.kube.workflow.runs import Runs, RunView
from durable_sandbox.kube.workflow.settings import OperatorSettings

__all__ = ["LIFECYCLE_LOGGER", "Publisher", "say"]

lifecycle = logging.getLogger(LIFECYCLE_LOGGER)
# Steps of a run's life: INFO whatever the Event's type (a failed run is the run's outcome, not trouble of the
# operator's); any other Event (a refusal, a blocked cleanup: something a person must look at) at its own level.
STEPS = frozenset({"Provisioned", "SnapshotTaken", "SnapshotDeleted", "SandboxLost", "Recovered", "WaitingForSignal",
                   "Suspended", "Resumed", "Retrying", "Succeeded", "Failed", "Cancelled", "CleanupDone"})


def say(body: Mapping[str, Any], message: str, level: int = logging.INFO) -> None:
    """One line of the lifecycle log about the Workflow ``body``: ``<namespace>/<name> (run <id>): <message>``."""
    meta = body.get("metadata") or {}
    namespace, name, uid = str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")
    run = cluster_run_id(name, uid) if name and uid else None
    lifecycle.log(level, "%s/%s (run %s): %s", namespace, name, run, message, extra=about(namespace, name, run))


def event_line(event: LifecycleEvent) -> tuple[int, str]:
    """The level and the text of the lifecycle line of ``event``."""
    level = logging.INFO if event.reason in STEPS or event.type == "Normal" else logging.WARNING
    return level, f"{event.reason}: {event.message}"


class Publisher:
    def __init__(self, objects: CustomObjects, events: EventRecorder, runs: Runs, settings: OperatorSettings,
                 away: ApiServerAway | None = None) -> None:
        self.objects = objects
        self.away = away if away is not None else events.away
        self.events = events
        self.runs = runs
        self.settings = settings
        self._background: set[asyncio.Task[Any]] = set()  # Events being written

    # ------------------------------------------------------------------ clock-driven writes, on a budget

    def _periodic_interval(self, floor: float) -> float:
        return max(floor, len(self.runs.views) / self.settings.periodic_writes_per_s)

    def status_interval(self) -> float:
        return self._periodic_interval(self.settings.status_interval)

    def event_interval(self) -> float:
        return self._periodic_interval(KubernetesStore.event_interval)

    # ------------------------------------------------------------------ what the executor wrote and read

    def observed(self, run_id: str, commit: Commit | None, changes: dict[str, Any] | None) -> None:
        view = self.runs.views.get(run_id)
        if view is None:
            return
        if commit is not None and commit.records:
            view.projection.feed(commit.records)
            for event in lifecycle_events(commit.records):
                self.emit(view.body, event)
        if changes and view.run is not None:
            known = {k: v for k, v in changes.items() if hasattr(view.run, k)}
            # The store stamps updated_at on every write; a retry's backoff is counted from it.
            view.run = replace(view.run, **known, updated_at=time.time())
        self.offer(view)

    def read(self, run_id: str, rows: list[OperationRecord]) -> None:
        view = self.runs.views.get(run_id)
        if view is not None:
            view.projection.catch_up(rows)

    # ------------------------------------------------------------------ status

    def writer_for(self, view: RunView) -> StatusWriter:
        async def patch(status: dict[str, Any]) -> None:
            await self.patch_status(view, status)

        return StatusWriter(patch, interval=self.status_interval, away=self.away)

    def republish(self, view: RunView) -> None:
        """Write the status anew when this daemon starts and the object's status disagrees with the run: the
        process that last changed the run may have died (or lost the API server) before its status patch
        landed, and a run waiting for a signal that says Running would never get one."""
        shown = view.body.get("status") or {}
        status = self.status_of(view)
        if any(shown.get(key) != status.get(key) for key in ("phase", "pendingCallbacks")):
            self.offer(view)

    def offer(self, view: RunView) -> None:
        if view.writer is None:
            return
        if view.run is not None and continued_to(view.run) is not None:
            return  # it continued as new: the Workflow is not done, its next turn goes on with the next run (chain.py)
        status = self.status_of(view)
        phase = status.get("phase")
        if phase != view.phase:
            shown = (view.body.get("status") or {}).get("phase")
            event = run_status_event(phase or "", phase_message(view, phase or ""))
            if event is not None and event.reason in TERMINAL_REASONS and view.run is not None:
                # Every replica that writes this status (the executing one; one re-activating the finished run
                # that saw its status stale) may get here: the Event's fixed name keeps it to one.
                event = terminal_event(event, workflow=view.name, uid=view.uid, epoch=view.run.epoch)
            if event is not None:
                self.emit(view.body, event, said=phase == shown)
            if phase != shown:
                self._say_phase(view, phase or "", shown, event)
            view.phase = phase
        view.writer.offer(status)

    def refused(self, view: RunView, reason: str, message: str) -> None:
        """The run cannot go on here for now, for a reason a person must fix (a Secret it may not read, a journal
        write the API server refuses): Ready=False with ``reason`` and ``message``, and one Warning Event per
        distinct message (the state is retried, not re-announced)."""
        if (view.extra.not_runnable, view.extra.not_runnable_reason) != (message, reason):
            self.emit(view.body, LifecycleEvent(reason, message[:1024], "Warning"))
        view.extra.not_runnable, view.extra.not_runnable_reason = message, reason
        self.offer(view)

    def status_of(self, view: RunView) -> dict[str, Any]:
        previous = (view.body.get("status") or {}).get("conditions") or []
        status = render(view.run, view.projection, view.extra, run_id=view.run_id, previous_conditions=previous)
        if view.chain:
            status["runs"] = chain_status(view.chain, view.run)
        engine = self.runs.engines.get(view.namespace)
        if engine is not None:
            store = engine.store
            names = store.journal_objects(view.run_id) if hasattr(store, "journal_objects") else []
            status["journal"] = [{"name": n} for n in names]
        return status

    async def patch_status(self, view: RunView, status: dict[str, Any]) -> None:
        await self.objects.patch_status(WORKFLOWS, view.namespace, view.name, status)  # None: the Workflow is gone

    async def patch_conditions(self, view: RunView, body: Mapping[str, Any]) -> None:
        """Write the conditions alone (the finalizer's CleanupBlocked), whatever else the status says."""
        view.body = body
        try:
            await self.patch_status(view, {"conditions": self.status_of(view)["conditions"]})
        except Exception:  # a condition is a notice: the cleanup's retry writes it again
            return

    # ------------------------------------------------------------------ Events

    def _say_phase(self, view: RunView, phase: str, shown: str | None, event: LifecycleEvent | None) -> None:
        """The lifecycle line of a phase the Workflow's status does not show yet (the Event's, said by emit)."""
        run = view.run
        if event is not None and event.reason in TERMINAL_REASONS and run is not None:
            say(view.body, f"finished: {phase} after {took(max(0.0, run.updated_at - run.created_at))} "
                           f"(attempt {run.epoch + 1}): {event.message}")
        elif phase == "Running":
            say(view.body, "started" if shown in (None, "", "Pending") else f"running again (was {shown})")

    def admitted(self, view: RunView, detail: str) -> None:
        say(view.body, f"admitted: {detail}")

    def emit(self, body: Mapping[str, Any], event: LifecycleEvent, *, said: bool = False) -> None:
        """Write ``event`` about the object ``body`` in the background (an Event never holds a run up), and say
        it in the lifecycle log unless ``said`` (already, by this replica or the one before it) or it is the end
        of a run (said with its outcome and duration by :meth:`offer`)."""
        if not said and event.reason not in TERMINAL_REASONS:
            level, text = event_line(event)
            say(body, text, level)
        task = asyncio.get_running_loop().create_task(self.events.emit(dict(body), event))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)


def phase_message(view: RunView, phase: str) -> str:
    """The message of the Event of a run entering ``phase``."""
    run = view.run
    if phase == RETRYING and run is not None and (retry := backoff(run, view.extra.policy)) is not None:
        return retry_message(run, retry)
    if phase == "Waiting" and run is not None:
        pending = ", ".join(run.pending_callbacks)
        return f"waiting for signal(s) {pending}; set spec.signals to continue" if pending else "waiting for a timer"
    if phase in ("Failed", "Cancelled") and run is not None and run.error is not None:
        return f"{run.error.type}: {run.error.message}"[:1024]
    if phase == "Succeeded":
        calls = view.projection.calls()
        if not calls["total"]:  # an entrypoint that made no tool calls: a count of 0/0 says nothing
            return f"run {view.run_id} succeeded"
        return f"run {view.run_id} succeeded ({calls['completed']}/{calls['total']} calls)"
    return f"run {view.run_id} is {phase.lower()}"
