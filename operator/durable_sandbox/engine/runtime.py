"""Per-execution state of one run: the folded journal, id bookkeeping, the fenced writer, events.

One ``RunRuntime`` lives while one worker executes a run; every context of the run (the root and the
children of parallel branches) shares it. Extensions (sandbox sessions) use it through
``ctx.operations`` to look up and journal their own operations.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.errors import (
    CallbackTimeout,
    DuplicateOperationError,
    Handover,
    NonDeterminismError,
    RunCancelledError,
    StepFailed,
    Suspend,
)
from durable_sandbox.engine.records import Commit, ErrorInfo, Event, OperationRecord, OpKind, OpStatus
from durable_sandbox.engine.serialization import dumps, to_jsonable

if TYPE_CHECKING:
    from durable_sandbox.engine.store import Store

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
        services: dict[str, Any],
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.workflow = workflow
        self.fence = fence
        self.epoch = epoch
        self.signals = signals
        self.sandbox_factory = sandbox_factory
        self.inline_sleep_limit = inline_sleep_limit
        self.services = services  # what extensions need from the engine (providers, hibernation policy)
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
                from durable_sandbox.engine.context import nondeterminism

                raise nondeterminism(op_id, first, kind, name, digest)
            latest = self.latest[op_id]
            if latest.status == COMPLETED:
                return latest
        if self.handover is not None:
            raise Handover(self.run_id, self.handover)
        if self.draining and not while_draining:
            raise Suspend([])
        return self.latest.get(op_id)

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
    ) -> None:
        """Commit records (and anything deferred) before the run moves on: durability first."""
        recs = list(records)
        if self._deferred:
            recs[:0] = self._deferred
            self._deferred = []
        commit = Commit(recs, run=run, cache=cache, check_cancel=check_cancel and self.cancel_reason is None)
        if boundary:
            commit.thread_state = self.state_change()
        try:
            await self.store.commit(self.run_id, self.fence, commit)
        except RunCancelledError as exc:
            self.cancel_reason = exc.reason
            raise asyncio.CancelledError(exc.reason) from None
        for rec in recs:
            self.rows.append(rec)
            self.latest[rec.op_id] = rec
            self.first.setdefault(rec.op_id, rec)

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

    def pending_records(self) -> list[OperationRecord]:
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
        # Events are for observers, not for correctness: batch them off the step path.
        await asyncio.sleep(0)
        while self._events:
            batch, self._events = self._events, []
            try:
                await self.store.append_events(batch)
            except Exception:  # an observer's feed must never fail the run
                return

    async def flush_events(self) -> None:
        if self._event_flush is not None:
            await asyncio.shield(self._event_flush)
        if self._events:
            batch, self._events = self._events, []
            await self.store.append_events(batch)

    # ------------------------------------------------------------------ waiting

    def pending_callbacks(self) -> list[dict[str, Any]]:
        return pending_callbacks(self.latest.values())


def pending_callbacks(latest: Any) -> list[dict[str, Any]]:
    return [
        {"id": r.op_id, "payload": (r.meta or {}).get("payload")}
        for r in latest
        if r.kind == OpKind.CALLBACK.value and r.status == STARTED
    ]

