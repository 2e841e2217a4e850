"""Per-execution state of one run: the fenced writer, and the parts it holds: the journal folded for replay
(engine/replay.py), what waits for the next commit (engine/deferred.py), the run's events
(engine/run_events.py), thread state, activity for suspension and the run's stop requests.

One ``RunRuntime`` lives while one worker executes a run; every context of the run (the root and the
children of parallel branches) shares it. Extensions (sandbox sessions) use it through
``ctx.operations`` to look up and journal their own operations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.deferred import Deferred
from durable_sandbox.engine.errors import (
    CallbackTimeout,
    Handover,
    LeaseLost,
    RunCancelledError,
    StepFailed,
    StoreRefused,
    StoreUnavailable,
    Suspend,
)
from durable_sandbox.engine.extensions import Extensions
from durable_sandbox.engine.records import Commit, ErrorInfo, OperationRecord, OpKind, OpStatus
from durable_sandbox.engine.refusals import RefusalHold, commit_holding
from durable_sandbox.engine.replay import ReplayLedger, duplicate_notice
from durable_sandbox.engine.run_events import RunEvents
from durable_sandbox.engine.run_handlers import RunHandlers
from durable_sandbox.engine.serialization import dumps, to_jsonable

if TYPE_CHECKING:
    from durable_sandbox.engine.store import Store

log = logging.getLogger("durable_sandbox.engine")

COMPLETED = OpStatus.COMPLETED.value
FAILED = OpStatus.FAILED.value
STARTED = OpStatus.STARTED.value


class ReplayFrontier(BaseException):
    """Raised in a read-only replay (engine/readonly.py) where the run would do something not yet recorded: the
    replay stops there. A BaseException so that ``except Exception`` in user code cannot swallow it."""


class RunRuntime:
    def __init__(
        self,
        *,
        store: Store,
        run_id: str,
        workflow: str,
        fence: int,
        epoch: int,
        rows: list[OperationRecord],
        signals: dict[str, Any],
        thread_id: str | None,
        thread_state: Any,
        sandbox_factory: Callable[..., Any] | None,
        inline_sleep_limit: float,
        extensions: Extensions | None = None,
        hibernate_after: float | None = None,
        read_only: bool = False,
    ) -> None:
        self.store = store
        # A query's replay (engine/readonly.py): new work and every write stop it (ReplayFrontier).
        self.read_only = read_only
        self.run_id = run_id
        self.workflow = workflow
        self.fence = fence
        self.epoch = epoch
        self.signals = signals
        self.sandbox_factory = sandbox_factory
        self.inline_sleep_limit = inline_sleep_limit
        # What the process driving the run hands to extensions (sandbox sessions, built-in workflows), by type.
        self.extensions = extensions if extensions is not None else Extensions()
        self.hibernate_after = hibernate_after  # how long a waiting run keeps its sandboxes (None: their default)
        self.ledger = ReplayLedger(rows)
        self.rows = self.ledger.rows
        self.latest = self.ledger.latest
        self.first = self.ledger.first
        self.handlers = RunHandlers(rows)  # ctx.query_handler / ctx.update_handler (engine/run_handlers.py)
        self.deferred = Deferred(lambda: self.write(hold=False))
        self._patches: dict[str, bool] = {}
        self.thread_id = thread_id
        self.thread_state: dict[str, Any] = thread_state if isinstance(thread_state, dict) else {}
        self._state_touched = False
        self._state_digest = dumps(self.thread_state) if thread_id else ""
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.cancel_reason: str | None = None
        # Set by RunExecutor.hand_over: new operations stop the run (Handover) instead of starting.
        self.handover: str | None = None
        self.events = RunEvents(store, run_id)
        if not read_only:
            for first, again in self.ledger.duplicates:  # reported, never acted on twice (engine/replay.py)
                log.warning("%s", duplicate_notice(run_id, first, again))
                self.emit("journal.duplicate", opId=first.op_id, seqs=[first.seq, again.seq])
        self.last_yield = time.perf_counter()

    # ------------------------------------------------------------------ ids and replay

    def enter(
        self, op_id: str, kind: str, name: str, digest: str | None, *, while_draining: bool = False
    ) -> OperationRecord | None:
        """Claim ``op_id`` for this execution and return its recorded state (None if new).

        Raises ``DuplicateOperationError`` for an id used twice, ``NonDeterminismError`` when the
        recorded kind/name/input differ from what the code asks for, and ``Suspend`` for new work
        after the run decided to wait (a raw ``asyncio.gather`` whose sibling hit a callback).
        """
        latest = self.ledger.enter(op_id, kind, name, digest)
        # Updates committed before this operation ended are applied before it returns (engine/run_handlers.py).
        if self.handlers.behind:
            self.handlers.catch_up(self._ended_at(latest))
        if latest is not None and latest.status == COMPLETED:
            return latest
        if self.read_only:
            raise ReplayFrontier(op_id)
        if self.handover is not None:
            raise Handover(self.run_id, self.handover)
        if self.draining and not while_draining:
            raise Suspend([])
        return latest

    def _ended_at(self, latest: OperationRecord | None) -> int | None:
        """The seq of the row that ended the operation (completed, or failed for good); None if it goes on."""
        if latest is None or latest.status == STARTED:
            return None
        if latest.status == COMPLETED or self.next_attempt(latest)[1] is None:
            return latest.seq
        return None

    def reached(self, op_id: str) -> None:
        """Count a recorded operation as reached without entering it: an extension's own record of a
        kind workflow code enters (a sandbox session's ``replay:`` callback, written only while it
        recovers), which a later execution that needs no recovery never meets again."""
        self.ledger.unreached.discard(op_id)

    def check_all_reached(self) -> None:
        """Called when the workflow returned: a completed operation this execution never reached is a
        NonDeterminismError (engine/replay.py)."""
        self.ledger.check_all_reached()

    @property
    def replaying(self) -> bool:
        """True while the execution has not yet reached every operation recorded before it began."""
        return bool(self.ledger.unreached)

    def lookup(self, op_id: str) -> OperationRecord | None:
        return self.latest.get(op_id)

    def next_attempt(self, prev: OperationRecord) -> tuple[int, float | None]:
        """(attempt number, when it may start) for an operation that has not completed; None = failed for good."""
        if prev.status == STARTED:
            return prev.attempt, 0.0  # interrupted by a crash: run the same attempt again
        next_at = (prev.meta or {}).get("nextAttemptAt")
        if next_at is not None:
            return prev.attempt + 1, float(next_at)
        if prev.epoch < self.epoch:  # the run was retried after failing: failed operations run again
            return prev.attempt + 1, 0.0
        return prev.attempt, None

    def recorded_failure(self, rec: OperationRecord) -> Exception:
        err = rec.error or ErrorInfo("Error", "unknown failure")
        if rec.kind == OpKind.CALLBACK.value and err.type == CallbackTimeout.__name__:
            return CallbackTimeout(rec.op_id, float((rec.meta or {}).get("timeout") or 0))
        return StepFailed(rec.op_id, err.type, err.message, rec.attempt, err.retryable)

    def patched(self, op_id: str) -> bool:
        if op_id in self._patches:
            return self._patches[op_id]
        # The marker has its own id ("<scope>patch:<change id>") so that the guarded code may reuse the
        # change id for its step (`if ctx.patched("x"): await ctx.step("x", ...)`) without the two
        # records colliding on replay.
        scope, _, change_id = op_id.rpartition("/")
        marker = f"{scope}/patch:{change_id}" if scope else f"patch:{change_id}"
        rec = self.latest.get(marker)
        if rec is not None and rec.kind == OpKind.PATCH.value:
            value = bool(rec.result)
        else:
            value = not self.ledger.unreached
            self.deferred.defer(
                OperationRecord(marker, OpKind.PATCH.value, change_id, COMPLETED, 1, None, value, epoch=self.epoch)
            )
        self._patches[op_id] = value
        return value

    # ------------------------------------------------------------------ writing

    async def write(
        self,
        *records: OperationRecord,
        check_cancel: bool = False,
        cache: tuple[str, Any, float | None] | None = None,
        boundary: bool = False,
        run: dict[str, Any] | None = None,
        hold: bool = True,
    ) -> None:
        """Commit records (and anything deferred) before the run moves on: durability first. A commit the
        store refuses is held here and offered again while the engine has a ``RefusalHold`` (engine/refusals.py):
        what completed is kept, never executed again; ``hold=False`` raises the refusal at once."""
        if self.read_only:
            raise ReplayFrontier(records[0].op_id if records else "(commit)")
        await self.deferred.settle()
        await self.confirm_unsure()
        recs = list(records)
        carried = self.deferred.take()
        if carried:
            recs[:0] = carried
        commit = Commit(recs, run=run, cache=cache, check_cancel=check_cancel and self.cancel_reason is None)
        if boundary:
            commit.thread_state = self.state_change()
        try:
            await commit_holding(self.store, self.run_id, self.fence, commit, self.refusal_hold if hold else None,
                                 released=lambda: self.handover is not None)
        except RunCancelledError as exc:
            self.deferred.put_back(carried)  # not written: they go with the run's next (final) commit
            self.cancel_reason = exc.reason
            raise asyncio.CancelledError(exc.reason) from None
        except BaseException as exc:
            # Refused or fenced out, the commit did not land; cancelled in flight or its answer lost, it may have.
            self.deferred.put_back(carried, unsure=not outcome_known(exc))
            raise
        self.ledger.appended(recs)
        self.deferred.landed(carried)

    @property
    def refusal_hold(self) -> RefusalHold | None:
        """How a refused commit is held (None: raised at once), as whoever built the engine chose."""
        return self.extensions.get(RefusalHold)

    def known_rows(self) -> list[OperationRecord]:
        """The journal as this execution knows it: committed rows, then what waits for the next commit."""
        waiting = self.deferred.records
        return self.rows + waiting if waiting else self.rows

    def defer_completion(self, record: OperationRecord) -> None:
        """Commit ``record`` with the run's next write instead of on its own: one API write per sandbox
        call instead of two (the completion of call i lands in the same atomic commit as the start of call
        i+1, so it is still committed before call i+1 executes). Every way a run stops commits what is
        deferred (the final commit, a hand-over, an interruption take ``pending_records``); if no write
        follows within ``RIDE_SECONDS`` (workflow code busy between calls), it is committed on its own, so a
        crash then loses no completed call (engine/deferred.py)."""
        self.deferred.ride(record)

    def committed(self, records: list[OperationRecord]) -> None:
        """Called once ``records`` (taken from ``pending_records`` or deferred) are committed: crash tests'
        ``after:<op>`` point of a deferred completion is here, where it has become durable."""
        self.deferred.landed(records)

    async def cancel_requested(self) -> str | None:
        """Why the run was cancelled, if a user cancelled it (here or through the store). A task
        cancellation without it is an interruption (Ctrl-C, SIGTERM, a process shutting down): the run
        is not over and must stay resumable."""
        if self.cancel_reason is None:
            fresh = await self.store.get_run(self.run_id)
            self.cancel_reason = fresh.cancel_requested if fresh is not None else None
        return self.cancel_reason

    def defer(self, record: OperationRecord) -> None:
        """Have ``record`` committed with the next write (before that write's own records)."""
        self.deferred.defer(record)

    async def pending_records(self) -> list[OperationRecord]:
        """What is deferred, for a final commit the caller makes (then ``committed`` with the same list)."""
        await self.deferred.settle()
        await self.confirm_unsure()
        return self.deferred.take()

    async def confirm_unsure(self) -> None:
        """Records put back from a commit whose outcome is unknown: those the journal holds already are rows
        (never written again), the others go with the next commit (engine/deferred.py)."""
        if self.deferred.unsure:
            after = max((r.seq for r in self.rows), default=0)
            landed = self.deferred.confirm(await self.store.journal_since(self.run_id, after))
            self.ledger.appended(landed)
            if landed:
                log.info("run %s: a commit whose outcome was unknown had landed; its records %s are not written "
                         "again", self.run_id, [f"{r.op_id} {r.status}" for r in landed])

    # ------------------------------------------------------------------ thread state

    def touch_state(self) -> dict[str, Any]:
        self._state_touched = True
        return self.thread_state

    def state_change(self) -> tuple[str, Any] | None:
        if not self._state_touched or self.thread_id is None:
            return None
        data = to_jsonable(self.thread_state, what="ctx.state")
        digest = dumps(data)
        if digest == self._state_digest:
            return None
        self._state_digest = digest
        return (self.thread_id, data)

    async def let_loop_run(self) -> None:
        """Yield to the event loop: work that never suspends (inline steps, synchronous commits) must
        still let lease renewal, signals and cancel through (callers check ``last_yield`` first)."""
        self.last_yield = time.perf_counter()
        await asyncio.sleep(0)

    # ------------------------------------------------------------------ activity (for suspension)

    def active_begin(self) -> None:
        self.active += 1
        self._idle.clear()

    def active_end(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    async def drain(self) -> None:
        """Let operations already running finish (and be recorded) before the run stops; start no new ones."""
        self.draining = True
        await self._idle.wait()

    # ------------------------------------------------------------------ events and waiting

    def emit(self, type: str, **data: Any) -> None:
        self.events.emit(type, **data)

    async def flush_events(self) -> None:
        await self.events.flush()

    def pending_callbacks(self) -> list[dict[str, Any]]:
        return pending_callbacks(self.latest.values())


def outcome_known(exc: BaseException) -> bool:
    """Whether a commit that raised ``exc`` surely did not land: refused, or fenced out (``LeaseLost``). A
    cancellation in flight, an unreachable store (``StoreUnavailable``) or anything else leaves it unknown."""
    if isinstance(exc, StoreUnavailable):
        return False
    return isinstance(exc, (LeaseLost, RunCancelledError, StoreRefused))


def pending_callbacks(latest: Any) -> list[dict[str, Any]]:
    """What the run waits for: its callbacks, and the ends of child runs (engine/children.py: a child's end
    signals the key its parent waits on, like a callback)."""
    out = []
    for r in latest:
        if r.status != STARTED:
            continue
        if r.kind == OpKind.CALLBACK.value:
            out.append({"id": r.op_id, "payload": (r.meta or {}).get("payload")})
        elif r.kind == OpKind.CHILD.value and r.meta and r.meta.get("waitKey"):
            out.append({"id": r.meta["waitKey"], "payload": {"child": r.op_id, "childRunId": r.meta.get("childRunId")}})
    return out
