"""Engine errors. Each message says what went wrong, where, and what to do about it."""

from __future__ import annotations

import time
from typing import Any

from durable_sandbox.engine.owner import describe_owner


class DurableError(Exception):
    """Base class of the engine's own errors."""


class NonDeterminismError(DurableError):
    """Replay met code that asks for something other than what the journal recorded."""

    def __init__(self, op_id: str, expected: dict[str, Any], actual: dict[str, Any]) -> None:
        self.op_id = op_id
        self.expected = expected
        self.actual = actual
        diffs = ", ".join(
            f"{k}: recorded {expected.get(k)!r}, code asked for {actual.get(k)!r}"
            for k in expected
            if expected.get(k) != actual.get(k)
        )
        super().__init__(
            f"Nondeterminism at operation {op_id!r}: {diffs}. The workflow code changed in a way that does "
            f"not match the run's journal; guard the change with ctx.patched(...) or start a new run."
        )


class DuplicateOperationError(DurableError):
    def __init__(self, op_id: str) -> None:
        self.op_id = op_id
        super().__init__(
            f"Operation id {op_id!r} is used twice in the same run; give every step, callback and sleep a "
            f"unique id (for loops, include the loop index: f'fetch-{{i}}')."
        )


class StepFailed(DurableError):
    """A step failed for good (retries exhausted or a non-retryable error); replays raise it again."""

    def __init__(self, op_id: str, error_type: str, message: str, attempts: int, retryable: bool = False) -> None:
        self.op_id = op_id
        self.error_type = error_type
        self.attempts = attempts
        self.retryable = retryable
        self.cause_message = message
        super().__init__(f"Step {op_id!r} failed after {attempts} attempt(s): {error_type}: {message}")


class StepTimeout(DurableError):
    retryable = True

    def __init__(self, op_id: str, seconds: float) -> None:
        super().__init__(f"Step {op_id!r} timed out after {seconds:g} seconds")


class CallbackTimeout(DurableError):
    def __init__(self, op_id: str, seconds: float) -> None:
        super().__init__(f"Callback {op_id!r} was not signalled within {seconds:g} seconds")


class ParallelError(ExceptionGroup):
    """One or more branches of ctx.parallel failed; ``failures`` maps each failed key to its error."""

    op_id: str
    failures: dict[str, Exception]

    def __new__(cls, op_id: str, failures: dict[str, Exception]) -> ParallelError:
        keys = ", ".join(sorted(failures))
        self = super().__new__(cls, f"Parallel {op_id!r}: branch(es) {keys} failed", list(failures.values()))
        self.op_id = op_id
        self.failures = dict(failures)
        return self

    def __init__(self, op_id: str, failures: dict[str, Exception]) -> None:
        super().__init__(self.message, list(failures.values()))

    def derive(self, excs: Any) -> ExceptionGroup[Exception]:  # type: ignore[override]
        return ExceptionGroup(self.message, excs)

    def __str__(self) -> str:
        parts = "; ".join(f"{k}: {type(e).__name__}: {e}" for k, e in sorted(self.failures.items()))
        return f"{self.message}: {parts}"


class SignalConflict(DurableError):
    def __init__(self, run_id: str, callback_id: str) -> None:
        super().__init__(
            f"Callback {callback_id!r} of run {run_id!r} was already signalled with a different value; "
            f"a callback takes one value (signalling the same value again is a no-op)."
        )


class RunNotFound(DurableError):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"Run {run_id!r} does not exist in this store; list runs with `dsb runs`.")


class RunConflict(DurableError):
    """A run id is reused for another workflow or input."""


class LeaseHeld(DurableError):
    """Another worker holds the run's lease (and is not known to be dead)."""

    def __init__(self, run_id: str, owner: str, expires_at: float) -> None:
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at
        self.remaining = max(0.0, expires_at - time.time())
        super().__init__(
            f"Run {run_id!r} is being executed by {describe_owner(owner)}; its lease runs for another "
            f"{_duration(self.remaining)} and is renewed while that worker lives. Only one worker executes a run "
            f"at a time: wait for it to finish (`dsb resume --wait {run_id}` waits and then continues the run), "
            f"or stop that worker."
        )


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class LeaseLost(DurableError):
    def __init__(self, run_id: str, fence: int) -> None:
        super().__init__(
            f"Lost the lease on run {run_id!r} (fencing token {fence} is stale): another worker took it over. "
            f"This worker stops executing the run; nothing it did after losing the lease was recorded."
        )


class StoreUnavailable(LeaseLost):
    """The store could not be reached to record an operation (an API server restart outlasting the store's
    retries). Handled as a lost lease, never as the run failing: this worker stops executing the run without
    writing (the outcome of what it was doing is unknown), its lease expires, and the run resumes from its
    journal when claimed again."""

    def __init__(self, detail: str, run_id: str | None = None) -> None:
        self.run_id = run_id
        what = f"run {run_id!r}" if run_id else "the run"
        DurableError.__init__(
            self,
            f"Could not reach the store for {what} ({detail}): this worker stops executing it; it resumes from "
            f"its journal when claimed again.",
        )


class RunCancelledError(DurableError):
    def __init__(self, run_id: str, reason: str) -> None:
        self.reason = reason
        super().__init__(f"Run {run_id!r} was cancelled: {reason}")


class WorkflowNotFound(DurableError):
    pass


class NotAWorkflow(WorkflowNotFound):
    """The reference names something that exists but is not a ``@workflow`` function: a mistake in the
    reference, not code missing from this process (no other process would find it either)."""


class NotRunnableHere(WorkflowNotFound):
    """This process cannot import the run's workflow; the run is left as it is for a process that can
    (one started where the code imports from, another operator replica with the code installed), instead
    of being failed: code missing from a process is not a failure of the run."""

    def __init__(self, run_id: str, cause: WorkflowNotFound, *, status: str = "", module: str | None = None) -> None:
        self.run_id = run_id
        self.cause = cause
        self.module = module  # the module the run's workflow is imported from (None: a name registered elsewhere)
        needs = (
            f"a process that can import module {module!r}: run from the directory it imports from, or with "
            f"PYTHONPATH set to that directory (or the code installed)"
            if module else "a process that registers its workflow (imports the module that defines it)"
        )
        state = f" ({status})" if status else ""
        super().__init__(
            f"Run {run_id!r} is not runnable in this process: {str(cause).rstrip('.')}. It was left as it is{state}, "
            f"for {needs}."
        )


class AlreadyExecuting(DurableError):
    """The run is already being executed by this process; a duplicate request to execute it is refused."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"Run {run_id!r} is already executing in this process.")


class RunNotFinished(DurableError):
    """The run is pending, running or waiting: deleting it needs a cancel first (or ``force``)."""

    def __init__(self, run_id: str, status: str, detail: str = "") -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(
            detail
            or f"Run {run_id!r} is {status}; cancel it first (`dsb cancel {run_id}`), or delete it with --force, "
            f"which cancels it (cleaning up its sandboxes) and then deletes it."
        )


class UpdateRefused(DurableError, ValueError):
    """An update that was not applied (its input did not validate, no such handler, the run finished, the
    handler raised): nothing was journaled; the message says why and what to send instead."""


class UpdateConflict(DurableError):
    def __init__(self, run_id: str, update_id: str) -> None:
        self.run_id = run_id
        self.update_id = update_id
        super().__init__(
            f"Update id {update_id!r} of run {run_id!r} was already applied with another name or input; an update "
            f"id names one update: send the same input to read its result again, or use a new id."
        )


class QueryRefused(DurableError, ValueError):
    """A query that could not be answered (no such handler, its argument did not validate, it raised)."""


class InvalidInput(DurableError, ValueError):
    """The input does not match the workflow's declared input type."""


class SerializationError(DurableError, TypeError):
    pass


class StoreError(DurableError):
    """The store cannot be used (not a store, not writable, full, deleted under the process, damaged).
    The message names the store and says what to do; nothing is written past this error."""


class JournalDamaged(StoreError):
    """A run's stored data cannot be trusted: a value failed its authentication (``tampered``: written by
    someone other than the operator that holds the key) or cannot be decoded (damaged). Never replayed and
    never retried as if it were transient: whoever drives the run stops, says so, and cleans up by what the
    providers themselves record (owner tags), not by what the damaged journal says."""

    def __init__(self, run_id: str, where: str, detail: str, *, tampered: bool, lost: bool = False) -> None:
        self.run_id = run_id
        self.where = where
        self.tampered = tampered
        self.lost = lost  # the journal of a run that ran is gone: starting afresh would run committed calls again
        what = ("was changed by someone other than the operator" if tampered
                else "is gone" if lost else "is damaged")
        whose = f"The journal of run {run_id!r}" if run_id else "A journal object"
        super().__init__(
            f"{whose} {what} ({where}: {detail}); nothing is executed from it. Delete the Workflow (its "
            f"sandboxes and snapshots are removed by their owner tags) and create it again."
        )

    @property
    def reason(self) -> str:
        """The condition reason an operator reports it under."""
        return "JournalTampered" if self.tampered else "JournalLost" if self.lost else "JournalDamaged"


class StoreRefused(StoreError):
    """The store refused a write for good (not a passing failure): a quota, a size limit, a permission. The run
    stops where it is without recording anything more (its journal is unchanged); it goes on once whatever
    refused lets it, from the journal as it was."""


class Suspend(BaseException):
    """Raised through workflow code when the run must wait (a callback or a long sleep).

    A BaseException so that ``except Exception`` in user code cannot swallow it.
    """

    def __init__(self, op_ids: list[str], wake_at: float | None = None) -> None:
        super().__init__(", ".join(op_ids))
        self.op_ids = op_ids
        self.wake_at = wake_at


class Handover(BaseException):
    """Raised through workflow code at the next operation boundary when this process stops executing the
    run without ending it (an operator replica shutting down, ``spec.suspend``): completed work is kept,
    the sandbox stays live for whoever continues the run, and the lease is released at once.

    A BaseException so that ``except Exception`` in user code cannot swallow it.
    """

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(f"Run {run_id!r} is handed over: {why}")
        self.run_id = run_id
        self.why = why


RETRYABLE_BY_DEFAULT = (TimeoutError, ConnectionError, StepTimeout)


def is_retryable(exc: BaseException) -> bool:
    flag = getattr(exc, "retryable", None)
    if isinstance(flag, bool):
        return flag
    return isinstance(exc, RETRYABLE_BY_DEFAULT)


def error_details(exc: BaseException) -> dict[str, Any] | None:
    if isinstance(exc, ParallelError):
        return {"failures": {k: {"type": type(e).__name__, "message": str(e)} for k, e in exc.failures.items()}}
    if isinstance(exc, NonDeterminismError):
        return {"opId": exc.op_id, "expected": exc.expected, "actual": exc.actual}
    return None
