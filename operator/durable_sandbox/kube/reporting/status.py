"""Workflow status: a bounded projection of the run's journal, and when to write it.

The full journal lives in the store (chunk objects in the cluster); status shows what `kubectl get`
and `kubectl describe` need and stays small however long the run is: counts, the call in flight,
the last 20 operations, the sandbox, the newest snapshot, conditions. :class:`Projection` folds
journal rows incrementally (fed by every commit, so nothing is re-read), :func:`render` turns it into
the status document, and :class:`StatusWriter` coalesces patches: at most about one per second per
Workflow, plus one at once on every phase change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from durable_sandbox.engine.driver import Backoff, RunPolicy, backoff
from durable_sandbox.engine.records import OperationRecord, OpKind, RunRecord, RunStatus
from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.api.client import brief
from durable_sandbox.kube.spec.conditions import WORKFLOW_CONDITIONS, by_type, condition, cut, rfc3339
from durable_sandbox.sandboxes import journal

log = logging.getLogger("durable_sandbox.kube.reporting.status")

RECENT_OPERATIONS = 20
# A result larger than this (JSON bytes) is not copied into status; resultRef says where it is.
RESULT_INLINE_LIMIT = 4096
TARGET_LIMIT = 200  # characters of a call's command (or path) in currentCall and recentOperations

PHASES: Final[Mapping[RunStatus, str]] = {
    RunStatus.PENDING: "Pending",
    RunStatus.RUNNING: "Running",
    RunStatus.WAITING: "Waiting",
    RunStatus.SUSPENDED: "Suspended",
    RunStatus.SUCCEEDED: "Succeeded",
    RunStatus.FAILED: "Failed",
    RunStatus.CANCELLED: "Cancelled",
}
# A failed run whose next attempt will start (spec.retry): not finished, so neither Failed nor Succeeded.
RETRYING = "Retrying"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed", "Cancelled"})


@dataclass
class Projection:
    """What status shows of a journal, folded row by row (O(1) memory beyond the call counter)."""

    total_calls: int | None = None  # known for toolCalls Workflows; entrypoints count what they reach
    tally: journal.Tally = field(default_factory=journal.Tally)  # snapshots, recoveries, calls: as dsb inspect counts
    current: dict[str, Any] | None = None
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_OPERATIONS))
    sandbox: dict[str, Any] | None = None
    recovering: bool = False
    callbacks: dict[str, Any] = field(default_factory=dict)  # pending callback id -> its payload
    answered: set[str] = field(default_factory=set)  # callbacks the run got its signal for
    last_seq: int = 0

    def feed(self, rows: Iterable[OperationRecord]) -> None:
        for row in rows:
            if row.seq and row.seq <= self.last_seq:
                continue  # already folded (a re-read journal overlapping what commits fed)
            self.last_seq = max(self.last_seq, row.seq)
            self._fold(row)

    def catch_up(self, rows: Iterable[OperationRecord]) -> None:
        """Fold journal rows this process read rather than committed (another replica committed them): only
        rows that continue what is folded already, since folding out of order would show an older snapshot
        as the newest, and a skipped row could never be folded afterwards."""
        rows = list(rows)
        if rows and rows[0].seq <= self.last_seq + 1:
            self.feed(rows)

    def _fold(self, row: OperationRecord) -> None:
        kind, status = row.kind, row.status
        meta = row.meta or {}
        if kind == OpKind.CALLBACK.value:
            if status == "started":
                self.callbacks[row.op_id] = meta.get("payload")
            else:
                self.callbacks.pop(row.op_id, None)
                if status == "completed":
                    self.answered.add(row.op_id)
        self.tally.fold(row)
        index = journal.call_index(row)
        target = None
        if status == "started" and kind in (OpKind.SANDBOX_CALL.value, OpKind.STEP.value):
            self.current = {"opId": row.op_id, "kind": kind, "name": row.name}
            if index is not None:
                self.current["index"] = index
            if (started_target := journal.call_target(row)) is not None:
                self.current["target"] = cut(started_target, TARGET_LIMIT)
        elif self.current is not None and self.current["opId"] == row.op_id:
            target = self.current.get("target")  # a call's command is in its started record only
            self.current = None
        self._fold_sandbox(row)
        if status in ("completed", "failed"):
            summary: dict[str, Any] = {
                "opId": row.op_id,
                "kind": kind,
                "name": row.name,
                "status": status,
                "attempt": row.attempt,
                "finishedAt": rfc3339(row.ts),
            }
            if target is not None:
                summary["target"] = target
            if (outcome := journal.call_outcome(row) or journal.failed_call_outcome(row)) is not None:
                summary["exitCode"] = outcome["exitCode"]
            if row.error is not None:
                summary["error"] = cut(f"{row.error.type}: {row.error.message}", 256)
            self.recent.append(summary)

    def _fold_sandbox(self, row: OperationRecord) -> None:
        """The sandbox and whether it is recovering, from the sessions' records (sandboxes/journal.py)."""
        if row.kind not in journal.SANDBOX_KINDS:
            return
        if (made := journal.provisioned(row)) is not None:
            self.sandbox = {"name": made.session, "provider": made.provider, "providerId": made.sandbox_id}
            if made.runtime_class:
                self.sandbox["runtimeClassName"] = made.runtime_class
            if made.recovery:
                self.recovering = False
        elif journal.finalized(row) and row.status == "completed" and self.sandbox is not None:
            self.sandbox = {**self.sandbox, "providerId": None}
        if journal.recovery_started(row):
            self.recovering = True

    @property
    def latest_snapshot(self) -> str | None:
        return self.tally.latest_snapshot

    @property
    def recovery_count(self) -> int:
        return self.tally.recoveries

    def calls(self) -> dict[str, int]:
        completed, total = self.tally.calls(self.total_calls)
        return {"completed": completed, "total": total}


def _pending(callback_id: str, payload: Any) -> dict[str, Any]:
    """A pending callback as status shows it: its payload too, unless that is large (the journal has it)."""
    out: dict[str, Any] = {"id": callback_id}
    if payload is not None and len(json.dumps(payload, default=str)) <= RESULT_INLINE_LIMIT:
        out["payload"] = payload
    return out


def phase_of(run: RunRecord | None, *, suspended: bool = False) -> str:
    if run is None:
        return "Pending"
    if suspended and not run.status.terminal:
        return "Suspended"
    return PHASES[run.status]


@dataclass
class Extra:
    """What status needs besides the journal: the controller's own knowledge of the object."""

    generation: int | None = None
    suspended: bool = False
    attempt: int = 1
    policy: RunPolicy = field(default_factory=RunPolicy)  # the spec's timeoutSeconds and retry (a backoff is shown)
    cleanup_blocked: str | None = None  # why the provider refuses cleanup, while it does
    rejected: tuple[str, str] | None = None  # (reason, message): the operator refused to run the spec
    not_runnable: str | None = None  # this replica cannot import the workflow (left for another)
    not_runnable_reason: str | None = None  # the Ready condition's reason while not runnable (default NotRunnableHere)
    refused_signals: dict[str, str] = field(default_factory=dict)  # spec.signals keys refused -> why (too big)
    ignored: tuple[str, str] | None = None  # (reason, message): a spec change after the run finished
    result_ref: str | None = None
    worker_queue: str | None = None  # spec.worker.queue: the run is executed by the namespace's workers
    no_worker: str | None = None  # while no live worker of that queue is seen: what the run waits for


def render(
    run: RunRecord | None,
    projection: Projection,
    extra: Extra,
    *,
    run_id: str | None,
    previous_conditions: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The whole status document (everything but ``journal`` and ``kopf``, which others own)."""
    previous = by_type(previous_conditions)
    gen = extra.generation
    status: dict[str, Any] = {"observedGeneration": gen, "runId": run_id}
    if extra.rejected is not None:
        reason, message = extra.rejected
        status["phase"] = "Failed"
        status["conditions"] = [
            condition("Ready", False, reason, message, gen, previous),
            condition("Failed", True, reason, message, gen, previous),
            condition("Succeeded", False, reason, "the operator did not run this Workflow", gen, previous),
        ]
        status["error"] = {"type": reason, "message": cut(message)}
        return status
    retry = backoff(run, extra.policy) if run is not None else None
    phase = RETRYING if retry is not None else phase_of(run, suspended=extra.suspended)
    status["phase"] = phase
    status["calls"] = projection.calls()
    status["currentCall"] = projection.current if phase == "Running" else None
    status["recentOperations"] = list(projection.recent)
    status["sandbox"] = projection.sandbox
    status["latestSnapshot"] = projection.latest_snapshot
    status["recoveryCount"] = projection.recovery_count
    status["attempt"] = run.epoch + 1 if run is not None else extra.attempt
    status["maxAttempts"] = extra.policy.max_attempts
    pending = list(run.pending_callbacks) if run is not None and run.status == RunStatus.WAITING else []
    status["pendingCallbacks"] = [_pending(cb, projection.callbacks.get(cb)) for cb in pending]
    status["wakeAt"] = (rfc3339(retry.at) if retry is not None
                        else rfc3339(run.wake_at) if run is not None and run.status == RunStatus.WAITING else None)
    status["startedAt"] = rfc3339(run.created_at) if run is not None else None
    status["finishedAt"] = rfc3339(run.updated_at) if run is not None and run.status.terminal and retry is None else None
    error = run.error if run is not None and run.status in (RunStatus.FAILED, RunStatus.CANCELLED) else None
    status["error"] = {"type": error.type, "message": cut(error.message)} if error is not None else None
    status["result"], status["resultRef"] = None, None
    if run is not None and run.status == RunStatus.SUCCEEDED:
        blob = json.dumps(run.result, separators=(",", ":"), default=str)
        if len(blob) <= RESULT_INLINE_LIMIT:
            status["result"] = run.result
        else:
            status["resultRef"] = extra.result_ref or f"dsb --kube inspect {run_id}"
    status["conditions"] = conditions(run, projection, extra, previous, phase, pending, retry)
    return status


def retry_message(run: RunRecord | None, retry: Backoff) -> str:
    """What a run in backoff shows (its conditions, its Event): the failed attempt, why, and when the next starts."""
    error = run.error if run is not None else None
    return retry.describe(cut(f"{error.type}: {error.message}", 512) if error is not None else None,
                          at=rfc3339(retry.at))


def conditions(
    run: RunRecord | None,
    projection: Projection,
    extra: Extra,
    previous: dict[str, dict[str, Any]],
    phase: str,
    pending: list[str],
    retry: Backoff | None = None,
) -> list[dict[str, Any]]:
    gen = extra.generation
    err = run.error.message if run is not None and run.error is not None else ""
    out: list[dict[str, Any]] = []
    if retry is not None:
        # Neither Failed nor Succeeded is True while another attempt will start: `kubectl wait
        # --for=condition=Failed` returns once the last attempt failed, not at the first.
        message = retry_message(run, retry)
        out.append(condition("Ready", False, RETRYING, message, gen, previous))
        out.append(condition("Succeeded", False, RETRYING, message, gen, previous))
        out.append(condition("Failed", False, RETRYING, message, gen, previous))
    else:
        out.extend(_outcome(extra, previous, phase, pending, err))
    out.append(condition("Suspended", phase == "Suspended", "SuspendRequested" if phase == "Suspended" else "NotSuspended",
                          "spec.suspend is true" if phase == "Suspended" else "the run is not suspended", gen, previous))
    waiting = bool(pending)
    refused = "".join(f"; spec.signals.{key} was refused: {why}" for key, why in sorted(extra.refused_signals.items()))
    out.append(condition("WaitingForSignal", waiting, "WaitingForSignal" if waiting else "NotWaiting",
                          ("waiting for " + ", ".join(pending) + "; set spec.signals.<id> to continue" + refused)
                          if waiting else "the run waits for no signal", gen, previous))
    if extra.worker_queue is not None:
        idle = extra.no_worker is not None and phase not in TERMINAL_PHASES
        out.append(condition("WaitingForWorker", idle, "NoWorker" if idle else "NotWaiting",
                              extra.no_worker if idle and extra.no_worker is not None
                              else f"the run does not wait for a worker of queue {extra.worker_queue!r}", gen, previous))
    out.append(condition("Recovering", projection.recovering and phase == "Running", "SandboxLost" if projection.recovering else "NotRecovering",
                          "restoring the sandbox from its newest snapshot" if projection.recovering
                          else f"no sandbox is being recovered ({projection.recovery_count} recovery(ies) so far)", gen, previous))
    if extra.cleanup_blocked is not None or "CleanupBlocked" in previous:
        blocked = extra.cleanup_blocked is not None
        out.append(condition("CleanupBlocked", blocked, "ProviderRefused" if blocked else "CleanupDone",
                              extra.cleanup_blocked or "the provider cleaned up", gen, previous))
    return sorted(out, key=lambda c: WORKFLOW_CONDITIONS.index(c["type"]))  # a type not listed there is an error


def _outcome(extra: Extra, previous: dict[str, dict[str, Any]], phase: str,
             pending: list[str], err: str) -> list[dict[str, Any]]:
    """Ready, Succeeded and Failed of a run that is not in a retry's backoff."""
    gen = extra.generation
    if extra.not_runnable is not None:
        ready = (False, extra.not_runnable_reason or "NotRunnableHere", extra.not_runnable)
    elif phase in TERMINAL_PHASES and extra.ignored is not None:
        ready = (False, *extra.ignored)
    elif phase in TERMINAL_PHASES:
        # Finished: nothing more will happen to it (Succeeded or Failed says how it ended).
        ended = {"Succeeded": "the run succeeded", "Failed": "the run failed", "Cancelled": "the run was cancelled"}
        ready = (False, phase, f"{ended[phase]}: it is finished" + (f" ({cut(err, 512)})" if err else ""))
    elif phase == "Waiting":
        ready = (True, "Waiting", "the run waits for " + (", ".join(pending) if pending else "a timer"))
    elif phase == "Suspended":
        # Not Ready: paused by the user, it makes no progress until spec.suspend is false again.
        ready = (False, "Suspended", "spec.suspend is true: the run is paused between calls; set it to false to resume")
    else:
        ready = (True, phase, f"the run is {phase.lower()}")
    failed = phase in ("Failed", "Cancelled")
    return [
        condition("Ready", ready[0], ready[1], ready[2], gen, previous),
        condition("Succeeded", phase == "Succeeded",
                  "Succeeded" if phase == "Succeeded" else "NotFinished" if phase not in TERMINAL_PHASES else phase,
                  "the run succeeded" if phase == "Succeeded" else err or f"the run is {phase.lower()}", gen, previous),
        condition("Failed", failed, phase if failed else "NotFailed",
                  (err or f"the run {phase.lower()}") if failed else "the run has not failed", gen, previous),
    ]


# A status write that took d seconds is followed by at least WRITE_COST_FACTOR * d seconds without one (phase
# changes excepted). Every write of a Workflow rewrites the whole object: a 10,000-call Workflow is ~650 KB, which
# the API server decodes, validates, stores and sends to every watcher, taking up to seconds on a busy server;
# this keeps such a Workflow's status writes to about a tenth of the time, and leaves small ones at `interval`.
WRITE_COST_FACTOR = 10.0
# ... but `kubectl get` shows progress at least this often (seconds) however slow the writes.
MAX_WRITE_GAP = 30.0


class StatusWriter:
    """Coalesces status patches of one Workflow: the newest document wins, written at most about once
    per ``interval`` seconds (longer after a slow write: WRITE_COST_FACTOR), except that a phase change is
    written at once. One task writes; a write under way is never cut short (the next document waits for it)."""

    def __init__(
        self, patch: Callable[[dict[str, Any]], Awaitable[None]], *, interval: float | Callable[[], float] = 1.0,
        cost_factor: float = WRITE_COST_FACTOR, away: ApiServerAway | None = None,
    ) -> None:
        self._patch = patch
        self.away = away if away is not None else ApiServerAway()  # where an API server not answering is said
        # A callable is asked before every write: the operator stretches the interval when many Workflows
        # run at once, so that their status patches together stay within a budget (see OperatorSettings).
        self.interval = interval
        self.cost_factor = cost_factor
        self._last_duration = 0.0
        self._pending: dict[str, Any] | None = None
        self._offered_phase: str | None = None
        self._urgent = False
        self._wakeup = asyncio.Event()
        self._last_write = 0.0
        self._timer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.writes = 0

    def offer(self, status: dict[str, Any]) -> None:
        """Schedule ``status`` to be written (replacing anything not written yet)."""
        self._pending = status
        if status.get("phase") != self._offered_phase:
            self._offered_phase = status.get("phase")
            self._urgent = True
            self._wakeup.set()
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._write_loop())

    async def _write_loop(self) -> None:
        while self._pending is not None:
            delay = self._last_write + self.gap() - time.monotonic()
            if not self._urgent and delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
            self._urgent = False
            self._wakeup.clear()
            await self.flush()

    def gap(self) -> float:
        """Seconds from one write to the next that is not a phase change."""
        interval = self.interval() if callable(self.interval) else self.interval
        return max(interval, min(self.cost_factor * self._last_duration, MAX_WRITE_GAP))

    async def flush(self) -> None:
        """Write what is pending now (used on phase changes and before the daemon stops)."""
        async with self._lock:
            doc, self._pending = self._pending, None
            if doc is None:
                return
            started = time.monotonic()
            try:
                await self._patch(doc)
            except Exception as exc:  # status is a projection: the next offer writes it again
                if not self.away.unreachable(exc, "a status patch"):
                    log.warning("status patch failed: %s", brief(exc))
                if self._pending is None:
                    self._pending = doc
                self._last_write = time.monotonic()  # try again one gap later, not in a loop
                self._last_duration = self._last_write - started  # a timed-out write was a slow one
                return
            self.writes += 1
            self._last_write = time.monotonic()
            self._last_duration = self._last_write - started

    async def aclose(self, timeout: float = 10.0) -> None:
        """Write what is pending now and stop."""
        self._urgent = True
        self._wakeup.set()
        if self._timer is not None and not self._timer.done():
            done, _ = await asyncio.wait([self._timer], timeout=timeout)
            if not done:
                self._timer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._timer
        await self.flush()
