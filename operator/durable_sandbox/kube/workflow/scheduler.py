"""The scheduler: which runs have a task here (active) and which are parked, and what wakes them.

kopf hands every watch event of a Workflow (the initial listing included) to :meth:`Scheduler.notice`. A
run never seen is admitted in a task of its own; an active run is woken if its spec changed (status writes
do not count); a parked run is made active again by the event that can change its course (a new
``metadata.generation``; for a run another replica executes, also a change of its ``status.phase``) or by
its timer. When a task ends with a :class:`~durable_sandbox.kube.workflow.parking.Park`, the run is parked:
a small record and at most one timer handle, never a per-run poll. A replica with no active run left hands
the memory its last burst used back to the OS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, cast

from durable_sandbox.kube.api.client import brief, is_transient
from durable_sandbox.kube.api.resources import WORKFLOWS
from durable_sandbox.kube.reporting.status import TERMINAL_PHASES
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.workflow.parking import Park
from durable_sandbox.kube.workflow.runs import Parked, RunView
from durable_sandbox.kube.workflow.wing import Wing

log = logging.getLogger(__name__)

__all__ = ["TRANSIENT_WAKE_SPREAD", "Scheduler", "give_back_memory"]

TRANSIENT_WAKE_SPREAD = 4.0  # a run that woke while it was unreachable looks again after 1-4 x claim_retry

Serve = Callable[[RunView], Awaitable[Park | None]]


def give_back_memory() -> None:
    """No run is active any more: hand the memory the last burst of activity used back to the OS. Without
    this a replica's RSS stays at the high-water mark of its busiest moment (the C allocator keeps freed
    heap), however few runs it holds now. A full collection takes milliseconds and happens only when the
    replica has just gone idle; ``malloc_trim(0)`` where the C library has it (glibc)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim``, looked up once; None where there is none (not glibc)."""
    try:
        return cast(Callable[[int], int], ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim)
    except (OSError, AttributeError):
        return None


class Scheduler:
    def __init__(self, wing: Wing, serve: Serve) -> None:
        self.wing = wing
        self.runs, self.settings = wing.runs, wing.settings
        self._serve = serve  # the turns of one active run (kube/workflow/turn.py)

    # ------------------------------------------------------------------ watch events

    def notice(self, body: Mapping[str, Any]) -> None:
        """The watch saw ``body`` (or kopf listed it): bring it to its run. An active run is woken if the spec
        changed (status updates do not count); a parked one is made active again if the event can change
        its course; one never seen is admitted."""
        meta = body.get("metadata", {})
        uid, name = meta.get("uid", ""), meta.get("name", "")
        if not uid or not name:
            return
        run_id = cluster_run_id(name, uid)
        view = self.runs.views.get(run_id)
        if view is not None:
            view.notice(body)
            return
        if self.runs.stopping or run_id in self.runs.active:
            return  # starting up (the task reads the object itself) or stopping
        if meta.get("deletionTimestamp"):
            # Being deleted: the delete handler finalizes the run (kube/handlers.py); nothing to drive.
            self.unpark(run_id)
            return
        parked = self.runs.parked.get(run_id)
        if parked is not None and meta.get("generation") == parked.generation:
            phase = (body.get("status") or {}).get("phase")
            if not parked_run_wakes(parked.reason, parked.phase, phase):
                return
        self.activate(run_id, body, meta.get("namespace", ""), name, uid)

    def forget(self, body: Mapping[str, Any]) -> None:
        """The Workflow is gone (its finalizer was removed): drop what is kept of its run."""
        meta = body.get("metadata", {})
        if meta.get("uid") and meta.get("name"):
            self.unpark(cluster_run_id(meta["name"], meta["uid"]))

    def sandbox_changed(self, namespace: str, name: str) -> None:
        """A Sandbox changed: wake the runs waiting for it (it may be Ready, or let go by its holder)."""
        for view in self.runs.views.values():
            if view.namespace == namespace and view.waiting_for == name:
                view.wake.set()
        for run_id, parked in list(self.runs.parked.items()):
            if parked.namespace == namespace and parked.sandbox == name:
                self.activate(run_id, None, parked.namespace, parked.name, parked.uid)

    # ------------------------------------------------------------------ active and parked

    def unpark(self, run_id: str) -> Parked | None:
        parked = self.runs.parked.pop(run_id, None)
        if parked is not None and parked.timer is not None:
            parked.timer.cancel()
        return parked

    def activate(self, run_id: str, body: Mapping[str, Any] | None, namespace: str, name: str, uid: str) -> None:
        self.unpark(run_id)
        task = asyncio.get_running_loop().create_task(self._run_task(run_id, body, namespace, name, uid),
                                                      name=f"run {run_id}")
        self.runs.active[run_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self.runs.active.get(run_id) is t:
                del self.runs.active[run_id]
            if not self.runs.active and not self.runs.stopping:
                give_back_memory()
            if not t.cancelled() and t.exception() is not None:
                self.wing.metrics.reconcile_errors.labels(kind="Workflow").inc()
                log.error("run %s: %s", run_id, t.exception(), exc_info=t.exception())
                if not self.runs.stopping:  # try again later, as kopf retried a failed daemon
                    self.park(Parked(namespace, name, uid, None, "error", None), self.settings.not_runnable_retry)

        task.add_done_callback(done)

    def park(self, parked: Parked, delay: float | None) -> None:
        run_id = cluster_run_id(parked.name, parked.uid)
        if self.runs.stopping:
            return
        self.unpark(run_id)
        if delay is not None:
            parked.timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._due, run_id)
        self.runs.parked[run_id] = parked

    def runnable(self, run_id: str) -> None:
        """The run was made runnable behind its Workflow's back (a child's end wakes its parent,
        engine/children.py): its task takes a turn now, or the parked run is made active."""
        view = self.runs.views.get(run_id)
        first = run_id.partition("~")[0]  # a continue-as-new chain's run: parked under its Workflow's run id
        if view is not None:
            view.wake.set()
        elif run_id in self.runs.parked:
            self._due(run_id)
        elif first in self.runs.parked:
            self._due(first)

    def _due(self, run_id: str) -> None:
        """A parked run's timer fired: activate it (its task reads the object afresh)."""
        parked = self.runs.parked.get(run_id)
        if parked is not None and not self.runs.stopping:
            parked.timer = None
            self.activate(run_id, None, parked.namespace, parked.name, parked.uid)

    # ------------------------------------------------------------------ one active run's task

    async def _run_task(self, run_id: str, body: Mapping[str, Any] | None, namespace: str, name: str, uid: str) -> None:
        """Drive the run of one Workflow until it has nothing to do, then park it."""
        if body is None:
            body = await self._read(run_id, namespace, name, uid)
            if body is None:
                return
        view = RunView(namespace=namespace, name=name, uid=uid, run_id=run_id, body=body)
        self.runs.views[run_id] = view
        view.writer = self.wing.publisher.writer_for(view)
        park: Park | None = None
        try:
            park = await self._serve(view)
        finally:
            with contextlib.suppress(Exception):
                await view.writer.aclose()
            self.runs.forget(run_id)
            self.wing.engines.forget_run(view)
        if park is None or self.runs.stopping:
            return
        if view.wake.is_set() and not view.deleting:
            # The spec changed while the task was finishing: look at it now rather than park.
            self.activate(run_id, view.body, namespace, name, uid)
            return
        self.park(Parked(namespace, name, uid, view.generation, park.reason, (view.body.get("status") or {}).get("phase"),
                         sandbox=view.waiting_for), park.delay)

    async def _read(self, run_id: str, namespace: str, name: str, uid: str) -> Mapping[str, Any] | None:
        """The Workflow of a run woken by its timer; None when there is nothing to drive."""
        try:
            body = await self.wing.objects.get(WORKFLOWS, namespace, name)
        except Exception as exc:
            if not is_transient(exc) or self.runs.stopping:
                raise
            # A parked run woke (its timer) while the API server is away, e.g. restarting: not the run's
            # fault, so no error and no not_runnable_retry wait; look again in a few seconds, spread so
            # that the timers of a whole backlog do not all hit a recovering API server at once.
            delay = self.settings.claim_retry * random.uniform(1.0, TRANSIENT_WAKE_SPREAD)
            self.wing.away.unreachable(exc, f"waking the run of {namespace}/{name}")
            log.debug("%s/%s: the API server could not be reached (%s); trying again in %.1fs",
                      namespace, name, brief(exc), delay)
            self.park(Parked(namespace, name, uid, None, "api-unreachable", None), delay)
            return None
        if body is None or body.get("metadata", {}).get("uid") != uid or body["metadata"].get("deletionTimestamp"):
            return None  # gone, replaced, or being deleted (the delete handler finalizes it)
        return body


# The phases a run parked for these reasons shows once its status is written: a status event showing another is a
# write that landed after this replica's (the replica that handed the run over flushing its coalesced status
# late: a suspended run shown Pending for ever, the soak's soak-023-suspend), or someone editing status.
SETTLED_PHASES: Final[Mapping[str, frozenset[str]]] = {
    "suspended": frozenset({"Suspended"}),
    "finished": TERMINAL_PHASES,
}


def parked_run_wakes(reason: str, parked_phase: str | None, phase: str | None) -> bool:
    """Whether a status event (the generation unchanged) wakes a parked run: a held one when the replica executing
    it may have let it go (``held_run_may_be_free``); a suspended or finished one when the status shows a phase
    other than its own, so that its task writes the run's status again (``Publisher.republish``: once, as the
    status then agrees with the journal)."""
    if reason == "held":
        return held_run_may_be_free(parked_phase, phase)
    settled = SETTLED_PHASES.get(reason)
    return settled is not None and phase not in settled


def held_run_may_be_free(parked_phase: str | None, phase: str | None) -> bool:
    """Whether a status event may mean that the replica executing a run (whose Lease parked it here) let it go:
    a phase other than the one it was parked in, or any phase but Running. Not only a change: a run handed over
    within the second it started goes Pending -> (Running, never published: status writes are coalesced) ->
    Pending, and the replica that parked it in Pending must wake then, not when the Lease runs out. A wake that
    finds the Lease still held parks again."""
    return phase != parked_phase or phase != "Running"
