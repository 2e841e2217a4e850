"""Per-execution state of one run: the folded journal, id bookkeeping, the fenced writer, events.

One ``RunRuntime`` lives while one worker executes a run; every context of the run (the root and the
children of parallel branches) shares it. Extensions (sandbox sessions) use it through
``ctx.operations`` to look up and journal their own operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import (
    CallbackTimeout,
    DuplicateOperationError,
    Handover,
    NonDeterminismError,
    RunCancelledError,
    StepFailed,
    Suspend,
)
from durable_sandbox.engine.extensions import Extensions
from durable_sandbox.engine.records import Commit, ErrorInfo, Event, OperationRecord, OpKind, OpStatus
from durable_sandbox.engine.refusals import RefusalHold, commit_holding
from durable_sandbox.engine.serialization import dumps, to_jsonable

if TYPE_CHECKING:
    from durable_sandbox.engine.store import Store

# How long a deferred completion waits for the run's next write before it is committed on its own.
RIDE_SECONDS = 0.5
COMPLETED = OpStatus.COMPLETED.value
FAILED = OpStatus.FAILED.value
STARTED = OpStatus.STARTED.value
_ENTERED_KINDS = frozenset(
    k.value
    for k in (OpKind.STEP, OpKind.PARALLEL, OpKind.CALLBACK, OpKind.SLEEP, OpKind.SANDBOX_PROVISION, OpKind.SANDBOX_CALL)
)


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
    ) -> None:
        self.store = store
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
        self.latest: dict[str, OperationRecord] = {}
        self.first: dict[str, OperationRecord] = {}
        self.rows = rows
        for row in rows:
            self.latest[row.op_id] = row
            self.first.setdefault(row.op_id, row)
        # Ids recorded before this execution that it has not reached yet; while any remain, the run is
        # replaying history written by earlier code (what ctx.patched needs to know).
        # Sandbox lifecycle records (snapshots, restores, destroys) are the session's bookkeeping, never
        # entered by workflow code, so they do not count.
        self._unreached = {op for op, rec in self.first.items() if rec.kind in _ENTERED_KINDS}
        self._replayed_rows = len(rows)  # rows[:n] were recorded by earlier executions
        self._entered: set[str] = set()
        self._deferred: list[OperationRecord] = []
        # Completions that ride on the run's next commit (``defer``); their ``after:<op>`` fault point is
        # reached once that commit has landed.
        self._ridden: set[str] = set()
        self._rider_flush: asyncio.Task[None] | None = None
        self._rider_committing = False
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
        self._events: list[Event] = []
        self._event_flush: asyncio.Task[None] | None = None
        self._events_written = float("-inf")  # monotonic time of the last batch written
        self._events_now = asyncio.Event()  # set when the run stops: write what is left without waiting
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
        if op_id in self._entered:
            raise DuplicateOperationError(op_id)
        self._entered.add(op_id)
        self._unreached.discard(op_id)
        first = self.first.get(op_id)
        if first is not None:
            if first.kind != kind or first.name != name or (
                digest is not None and first.input_digest is not None and first.input_digest != digest
            ):
                raise nondeterminism(op_id, first, kind, name, digest)
            latest = self.latest[op_id]
            if latest.status == COMPLETED:
                return latest
        if self.handover is not None:
            raise Handover(self.run_id, self.handover)
        if self.draining and not while_draining:
            raise Suspend([])
        return self.latest.get(op_id)

    def reached(self, op_id: str) -> None:
        """Count a recorded operation as reached without entering it: an extension's own record of a
        kind workflow code enters (a sandbox session's ``replay:`` callback, written only while it
        recovers), which a later execution that needs no recovery never meets again."""
        self._unreached.discard(op_id)

    def check_all_reached(self) -> None:
        """Called when the workflow returned: an operation the journal records as completed that this
        execution never reached means the code changed under the run (typically a renamed id), which
        replay by id cannot see at the point of the call. Operations under a replayed parent (a completed
        parallel or branch returns without re-entering its children) count as reached; sandbox
        operations are the session's own bookkeeping and are not checked here."""
        checked = (OpKind.STEP.value, OpKind.PARALLEL.value, OpKind.CALLBACK.value, OpKind.SLEEP.value)
        for op_id in sorted(self._unreached, key=lambda op: self.first[op].seq):
            rec = self.latest[op_id]
            if rec.kind not in checked or rec.status != COMPLETED:
                continue
            parts = op_id.split("/")
            if any("/".join(parts[:i]) in self._entered for i in range(1, len(parts))):
                continue
            recorded = {r.op_id for r in self.rows[: self._replayed_rows]}
            new = [r for r in self.rows[self._replayed_rows :] if r.op_id not in recorded]
            same = [r for r in new if r.kind == rec.kind and r.name == rec.name]
            asked = same[0] if same else (new[0] if new else None)
            raise NonDeterminismError(
                op_id,
                {"opId": op_id, "kind": rec.kind, "name": rec.name},
                {"opId": asked.op_id, "kind": asked.kind, "name": asked.name}
                if asked is not None
                else {"opId": "(never reached)", "kind": rec.kind, "name": rec.name},
            )

    @property
    def replaying(self) -> bool:
        """True while the execution has not yet reached every operation recorded before it began."""
        return bool(self._unreached)

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
            value = not self._unreached
            self._deferred.append(
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
        await self._settle_riders()
        recs = list(records)
        carried = self._deferred
        if carried:
            recs[:0] = carried
            self._deferred = []
        commit = Commit(recs, run=run, cache=cache, check_cancel=check_cancel and self.cancel_reason is None)
        if boundary:
            commit.thread_state = self.state_change()
        try:
            await commit_holding(self.store, self.run_id, self.fence, commit, self.refusal_hold if hold else None,
                                 released=lambda: self.handover is not None)
        except RunCancelledError as exc:
            self._deferred[:0] = carried  # not written: they go with the run's next (final) commit
            self.cancel_reason = exc.reason
            raise asyncio.CancelledError(exc.reason) from None
        except BaseException:
            self._deferred[:0] = carried
            raise
        for rec in recs:
            self.rows.append(rec)
            self.latest[rec.op_id] = rec
            self.first.setdefault(rec.op_id, rec)
        self.committed(carried)

    @property
    def refusal_hold(self) -> RefusalHold | None:
        """How a refused commit is held (None: raised at once), as whoever built the engine chose."""
        return self.extensions.get(RefusalHold)

    def known_rows(self) -> list[OperationRecord]:
        """The journal as this execution knows it: committed rows, then what waits for the next commit."""
        return self.rows + self._deferred if self._deferred else self.rows

    def defer_completion(self, record: OperationRecord) -> None:
        """Commit ``record`` with the run's next write instead of on its own: one API write per sandbox
        call instead of two (the completion of call i lands in the same atomic commit as the start of call
        i+1, so it is still committed before call i+1 executes). Every way a run stops commits what is
        deferred (the final commit, a hand-over, an interruption take ``pending_records``); if no write
        follows within ``RIDE_SECONDS`` (workflow code busy between calls), it is committed on its own, so a
        crash then loses no completed call."""
        self._deferred.append(record)
        self._ridden.add(record.op_id)
        if self._rider_flush is None or self._rider_flush.done():
            self._rider_flush = asyncio.get_running_loop().create_task(self._flush_riders())

    async def _flush_riders(self) -> None:
        await asyncio.sleep(RIDE_SECONDS)
        if not any(r.op_id in self._ridden for r in self._deferred):
            return
        self._rider_committing = True
        try:
            # Not held: a refusal leaves them deferred for the run's next write, which holds (and which
            # would otherwise wait behind a hold in this background task that nothing could end).
            await self.write(hold=False)
        except BaseException:  # the records stay deferred: the next write or the final commit takes them
            return
        finally:
            self._rider_committing = False

    async def _settle_riders(self) -> None:
        """Before a write: a deferred completion being committed on its own lands first (commit order is
        journal order); a flush still waiting is dropped, since this write carries what it would."""
        task = self._rider_flush
        if task is None or task.done() or task is asyncio.current_task():
            return
        if self._rider_committing:
            await asyncio.shield(task)
        else:
            task.cancel()

    def committed(self, records: list[OperationRecord]) -> None:
        """Called once ``records`` (taken from ``pending_records`` or deferred) are committed: crash tests'
        ``after:<op>`` point of a deferred completion is here, where it has become durable."""
        for rec in records:
            if rec.op_id in self._ridden:
                self._ridden.discard(rec.op_id)
                faults.reach(f"after:{rec.op_id}")

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
        self._deferred.append(record)

    async def pending_records(self) -> list[OperationRecord]:
        """What is deferred, for a final commit the caller makes (then ``committed`` with the same list)."""
        await self._settle_riders()
        recs, self._deferred = self._deferred, []
        return recs

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

    # ------------------------------------------------------------------ events

    def emit(self, type: str, **data: Any) -> None:
        self._events.append(Event(self.run_id, type, {k: v for k, v in data.items() if v is not None}))
        if self._event_flush is None or self._event_flush.done():
            self._event_flush = asyncio.get_running_loop().create_task(self._flush_events())

    async def _flush_events(self) -> None:
        # Events are for observers, not for correctness: batch them off the step path. A store whose
        # writes are dear (``event_interval``: KubernetesStore, where each is an API write) gets at most one
        # batch per interval; ``flush_events`` cuts the wait short when the run stops.
        while self._events:
            wait = self._events_written + float(getattr(self.store, "event_interval", 0.0)) - time.monotonic()
            if wait > 0 and not self._events_now.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._events_now.wait(), wait)
            else:
                await asyncio.sleep(0)
            batch, self._events = self._events, []
            self._events_written = time.monotonic()
            try:
                await self.store.append_events(batch)
            except Exception:  # an observer's feed must never fail the run
                return

    async def flush_events(self) -> None:
        self._events_now.set()
        if self._event_flush is not None:
            await asyncio.shield(self._event_flush)
        if self._events:
            batch, self._events = self._events, []
            await self.store.append_events(batch)

    # ------------------------------------------------------------------ waiting

    def pending_callbacks(self) -> list[dict[str, Any]]:
        return pending_callbacks(self.latest.values())


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


def nondeterminism(op_id: str, rec: OperationRecord, kind: str, name: str, digest: str | None) -> NonDeterminismError:
    """The error of a replay that met ``kind``/``name``/``digest`` where the journal recorded ``rec``."""
    return NonDeterminismError(
        op_id,
        {"kind": rec.kind, "name": rec.name, "inputDigest": rec.input_digest},
        {"kind": kind, "name": name, "inputDigest": digest if digest is not None else rec.input_digest},
    )
