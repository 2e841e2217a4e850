"""The run driver: one meaning of a run's policy as a whole, wherever the run is driven.

A Workflow's spec says how its run is driven: ``timeoutSeconds`` (a wall-clock bound from the run's
creation, across every attempt and every wait, like a Job's ``activeDeadlineSeconds``), ``retry`` (more
attempts of a failed run, with backoff), ``suspend`` and ``cancel``. :class:`RunPolicy` holds the first two;
:func:`decide` says, from a run's record, the policy and the clock, what is to be done with the run next (a
:class:`Step`). It is the only place that judges a deadline or a retry, and it has two interpreters:

- :class:`LocalDriver` below, behind ``dsb run``, ``dsb resume`` and (through :func:`enforce`) ``dsb worker``:
  it sleeps through a retry's backoff in the process and cancels an execution at its deadline with a timer;
- the operator's turn (``kube/workflow/turn.py``), which parks the run through a backoff or a wait (no task
  is kept) and watches the deadline while the run executes.

Why the deadline counts from creation and not per attempt: a manifest must mean the same thing locally and
in the cluster, and in the cluster a run's attempts, waits and hand-overs between replicas are not visible to
whoever set the bound; "this run may take at most N seconds" is what an operator of the cluster can promise
and enforce (as Kubernetes does for Jobs). A bound per attempt belongs to what an attempt is made of: a step's
``timeout`` or a tool call's ``timeout``.

When the deadline passes, the run is cancelled (its sandbox cleaned up) with the reason ``timed out after Ns
(spec.timeoutSeconds)``: a run executing is cancelled there, a pending or waiting one is cancelled, and a
failed one that was waiting for its next attempt is not retried but marked cancelled for the same reason. An
explicit ``dsb resume`` (or running the same manifest again) of a failed run is one more attempt, whatever the
retry policy says, but never after the deadline.

Where the policy comes from: the operator takes it from the Workflow's spec on every turn (a user who can
edit only the run's records cannot change it); ``dsb run`` from the manifest, and it records it in the run's
labels (``POLICY_LABEL``) for ``dsb resume`` and ``dsb worker``, which have no manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from durable_sandbox.engine.client import RunClient
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.engine.state import RunState
from durable_sandbox.engine.store import Store

if TYPE_CHECKING:
    from durable_sandbox.engine.workflow import WorkflowDefinition

__all__ = [
    "POLICY_LABEL",
    "Backoff",
    "LocalDriver",
    "RetrySchedule",
    "RunPolicy",
    "Step",
    "backoff",
    "decide",
    "enforce",
    "time_out",
]

# The run label that records a run's policy (JSON: {"timeoutSeconds": ..., "retry": {...}}), for the
# drivers that have no manifest to read it from (`dsb resume`, `dsb worker`).
POLICY_LABEL = "durable-sandbox.dev/run-policy"


@dataclass(frozen=True)
class RetrySchedule:
    """More attempts of a failed run (spec.retry): ``max_attempts`` in all, the first included; the delay
    before attempt ``n`` (2 is the first retry) grows by ``backoff`` from ``initial_interval`` up to
    ``max_interval``."""

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 60.0

    def interval(self, attempt: int) -> float:
        """Delay before attempt ``attempt`` (2 is the first retry)."""
        return float(min(self.initial_interval * self.backoff ** max(attempt - 2, 0), self.max_interval))


@dataclass(frozen=True)
class RunPolicy:
    """How a run is driven as a whole: its deadline and its retries."""

    timeout: float | None = None  # seconds from the run's creation, every attempt and wait counted
    retry: RetrySchedule | None = None

    @property
    def max_attempts(self) -> int:
        return self.retry.max_attempts if self.retry is not None else 1

    def deadline(self, run: RunRecord) -> float | None:
        return run.created_at + self.timeout if self.timeout is not None else None

    @property
    def timeout_reason(self) -> str:
        """Why a run past its deadline is cancelled (its error message, status and Events say it)."""
        return f"timed out after {self.timeout:g}s (spec.timeoutSeconds)"

    def retry_at(self, run: RunRecord) -> float | None:
        """When a failed run's next attempt is due; None when no attempt is left (or it was cancelled)."""
        if run.status != RunStatus.FAILED or run.cancel_requested or run.epoch + 1 >= self.max_attempts:
            return None
        assert self.retry is not None
        return run.updated_at + self.retry.interval(run.epoch + 2)

    # ------------------------------------------------------------------ recorded with the run

    def to_labels(self) -> dict[str, str]:
        doc: dict[str, Any] = {}
        if self.timeout is not None:
            doc["timeoutSeconds"] = self.timeout
        if self.retry is not None:
            r = self.retry
            doc["retry"] = {"maxAttempts": r.max_attempts, "initialIntervalSeconds": r.initial_interval,
                            "backoff": r.backoff, "maxIntervalSeconds": r.max_interval}
        return {POLICY_LABEL: json.dumps(doc, separators=(",", ":"), sort_keys=True)} if doc else {}

    @classmethod
    def of(cls, run: RunRecord) -> RunPolicy:
        """The policy recorded in the run's labels (none recorded: one attempt, no deadline)."""
        return cls.from_labels(run.labels)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> RunPolicy:
        raw = labels.get(POLICY_LABEL)
        if not raw:
            return cls()
        doc = json.loads(raw)
        retry = doc.get("retry")
        return cls(
            timeout=float(doc["timeoutSeconds"]) if doc.get("timeoutSeconds") is not None else None,
            retry=RetrySchedule(
                max_attempts=int(retry["maxAttempts"]), initial_interval=float(retry["initialIntervalSeconds"]),
                backoff=float(retry["backoff"]), max_interval=float(retry["maxIntervalSeconds"]),
            ) if retry else None,
        )


@dataclass(frozen=True)
class Backoff:
    """A failed run that will be tried again: attempt ``failed`` of ``of`` failed, attempt ``failed + 1`` is due
    ``at``. Such a run is not finished, and nothing shown of it (a Workflow's phase and conditions, ``dsb
    inspect``) may say it is: a CI gate on ``kubectl wait --for=condition=Failed`` would stop at the first
    attempt."""

    failed: int
    of: int
    at: float

    @property
    def next(self) -> int:
        return self.failed + 1

    def describe(self, error: str | None = None, *, at: str | None = None) -> str:
        """One line for people: what failed and when the next attempt starts (``at`` preformatted, else UTC)."""
        when = at if at is not None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))
        failed = f"attempt {self.failed} of {self.of} failed" + (f" ({error})" if error else "")
        return f"{failed}; attempt {self.next} of {self.of} starts at {when} (spec.retry)"


def backoff(run: RunRecord, policy: RunPolicy) -> Backoff | None:
    """The backoff ``run`` is in under ``policy``: None unless it failed and another attempt will start (one
    that could start only after the deadline will not: the run is over, it is cancelled at the deadline)."""
    at = policy.retry_at(run)
    if at is None:
        return None
    deadline = policy.deadline(run)
    if deadline is not None and at >= deadline:
        return None
    return Backoff(failed=run.epoch + 1, of=policy.max_attempts, at=at)


class Driven(Protocol):
    """What the drivers need of an engine (``engine.Engine`` is one): its two halves and a cancel that
    carries out the cleanup."""

    @property
    def store(self) -> Store: ...

    @property
    def client(self) -> RunClient: ...

    @property
    def executor(self) -> RunExecutor: ...

    async def cancel(self, run_id: str, reason: str = ...) -> RunState: ...

    async def inspect(self, run_id: str) -> RunState: ...


StepKind = Literal["finished", "timeout", "execute", "backoff", "wait", "suspend", "suspended", "resume"]


@dataclass(frozen=True)
class Step:
    """What to do with a run next.

    - ``finished``: nothing (succeeded, cancelled, or failed with no attempt left);
    - ``timeout``: the deadline has passed: cancel the run (``RunPolicy.timeout_reason``);
    - ``execute``: execute it now (pending, orphaned, due, a retry due, or a cancel to carry out), cancelling
      the execution at ``deadline``;
    - ``backoff``: a failed run's next attempt; look again ``at``;
    - ``wait``: it waits on a signal or a timer; look again ``at`` (None: when signalled);
    - ``suspend`` / ``suspended`` / ``resume`` (only when the caller says the run is to be suspended): pause it
      between calls; it is paused (look again when told); it was paused and is no longer to be.
    """

    kind: StepKind
    at: float | None = None
    deadline: float | None = None


def decide(run: RunRecord, policy: RunPolicy, now: float, *, suspend: bool = False, manual: bool = False) -> Step:
    """The next step of ``run`` under ``policy`` at ``now``. ``suspend``: the run is to be paused (a cluster's
    spec.suspend). ``manual``: someone asked for this run to go on now (``dsb resume``, running the same
    manifest again), so a failed run gets one more attempt whatever its retry policy says."""
    deadline = policy.deadline(run)
    late = deadline is not None and now >= deadline
    if run.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED):
        return Step("finished")
    if run.status == RunStatus.FAILED:
        retry_at = now if manual and not run.cancel_requested else policy.retry_at(run)
        if retry_at is None:
            return Step("finished")
        if late:
            return Step("timeout")  # no attempt starts after the deadline
        if now < retry_at:
            return Step("backoff", at=retry_at if deadline is None else min(retry_at, deadline))
        return Step("execute", deadline=deadline)
    if late and not run.cancel_requested:
        return Step("timeout")
    if run.cancel_requested:
        return Step("execute", deadline=deadline)  # the cancel is carried out by executing (cleanup)
    if suspend:
        return Step("suspended") if run.status == RunStatus.SUSPENDED else Step("suspend")
    if run.status == RunStatus.SUSPENDED:
        return Step("resume")
    if run.status == RunStatus.WAITING:
        if run.wake_at is not None and run.wake_at <= now:
            return Step("execute", deadline=deadline)
        due = [t for t in (run.wake_at, deadline) if t is not None]
        return Step("wait", at=min(due) if due else None, deadline=deadline)
    return Step("execute", deadline=deadline)


async def time_out(engine: Driven, run: RunRecord, policy: RunPolicy) -> None:
    """The ``timeout`` step: ``run`` is past its deadline. A failed run waiting for its next attempt is marked
    cancelled under its lease; any other is asked to cancel, which whoever executes it next carries out (the
    next step is ``execute``: its sandbox is finalized), or the process executing it notices."""
    if run.status == RunStatus.FAILED:
        await engine.executor.expire(run.run_id, policy.timeout_reason)
    else:
        await engine.client.request_cancel(run.run_id, policy.timeout_reason)


def _now() -> float:
    return time.time()  # looked up at each call, so a test's clock (tests/unit/conftest.py) is seen


Around = Callable[[Callable[[], Awaitable[RunState]]], Awaitable[RunState]]
OnRetry = Callable[[RunRecord, int, float], None]  # the run, the attempt about to start, seconds until it starts


class LocalDriver:
    """Drives one run in this process under its policy until it finishes or waits (`dsb run`, `dsb resume`):
    executions in a row, a retry's backoff slept through, the deadline a timer that cancels the run.

    ``around`` wraps each execution (the CLI's live display); ``on_retry`` is told of every retry before its
    backoff. ``clock`` and ``sleep`` are the wall clock and the backoff's sleep (tests move time instead)."""

    def __init__(self, engine: Driven, *, around: Around | None = None, on_retry: OnRetry | None = None,
                 clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.engine = engine
        self.around = around
        self.on_retry = on_retry
        self.clock = clock if clock is not None else _now
        self.sleep = sleep if sleep is not None else asyncio.sleep

    async def drive(self, run_id: str, policy: RunPolicy, *, definition: WorkflowDefinition | None = None,
                    manual: bool = True) -> RunState:
        """Until the run finishes or waits. ``manual``: the first look treats a failed run as asked to go on."""
        engine = self.engine
        announced: int | None = None  # the epoch whose retry was announced (once, before its backoff)
        while True:
            run = await engine.client.get(run_id)
            now = self.clock()
            step = decide(run, policy, now, manual=manual)
            retry_at = None if manual else policy.retry_at(run)
            manual = False
            if step.kind in ("finished", "wait"):
                return await engine.inspect(run_id)
            if retry_at is not None and step.kind in ("backoff", "execute") and announced != run.epoch:
                announced = run.epoch
                if self.on_retry is not None:
                    self.on_retry(run, run.epoch + 2, max(0.0, retry_at - now))
            if step.kind == "timeout":
                await time_out(engine, run, policy)
            elif step.kind == "backoff":
                assert step.at is not None
                await self.sleep(max(0.0, step.at - now))
            elif step.kind == "execute":
                await self._execute(run, policy, step.deadline, definition)
            else:  # suspend, suspended, resume: only a cluster suspends a run (decide was not asked to)
                raise AssertionError(f"run {run_id}: step {step.kind} without a suspend")

    async def _execute(self, run: RunRecord, policy: RunPolicy, deadline: float | None,
                       definition: WorkflowDefinition | None) -> RunState:
        engine = self.engine

        async def execute() -> RunState:
            state = await engine.executor.drive(run.run_id, definition, if_busy="wait")
            assert state is not None  # "wait" never skips
            return state

        if deadline is None:
            return await (self.around(execute) if self.around is not None else execute())
        # At the deadline the run is cancelled through the engine, so sandbox cleanup runs as for any cancel.
        cancelling: list[asyncio.Task[Any]] = []
        timer = asyncio.get_running_loop().call_later(
            max(0.0, deadline - self.clock()),
            lambda: cancelling.append(asyncio.ensure_future(engine.cancel(run.run_id, policy.timeout_reason))),
        )
        try:
            return await (self.around(execute) if self.around is not None else execute())
        finally:
            timer.cancel()
            for task in cancelling:
                with contextlib.suppress(Exception):
                    await task


async def enforce(engine: Driven, policy_of: Callable[[RunRecord], RunPolicy], *, limit: int = 1000) -> list[RunRecord]:
    """The policies of a store's runs, for a worker (``dsb worker``): runs past their deadline are cancelled,
    and the failed runs whose next attempt is due are returned (the worker claims and executes them)."""
    due: list[RunRecord] = []
    now = time.time()
    live = [RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.SUSPENDED, RunStatus.FAILED]
    for run in await engine.store.list_runs(status=live, limit=limit):
        policy = policy_of(run)
        if policy.timeout is None and policy.retry is None:
            continue
        step = decide(run, policy, now)
        if step.kind == "timeout":
            await time_out(engine, run, policy)
        elif step.kind == "execute" and run.status == RunStatus.FAILED:
            due.append(run)
    return due
