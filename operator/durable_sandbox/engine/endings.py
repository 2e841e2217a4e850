"""How one execution of a run ends, and the commit that says so.

The table of endings: the workflow returned (succeeded), raised (failed), suspended (waiting, with its
wake time and pending callbacks), was cancelled by a user (cancelled) or interrupted (left pending, resumable
by any worker), lost its lease (nothing written), was handed over (left pending at an operation boundary,
its sandboxes live) or met a store that cannot record (raised, the run goes on from its journal later). Each
ending but the last three is one final commit, fenced and held like any write of the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from durable_sandbox.engine.continue_as_new import NextRun
from durable_sandbox.engine.errors import Handover, LeaseLost, StoreError, Suspend
from durable_sandbox.engine.records import Commit, ErrorInfo, Lease, OperationRecord, RunRecord, RunStatus
from durable_sandbox.engine.refusals import commit_holding
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.serialization import to_jsonable
from durable_sandbox.engine.store import Store

log = logging.getLogger("durable_sandbox.engine")

# What the engine's hooks are told before the final commit of a run that ends (engine/executor.py RunHooks).
AfterRun = Callable[[RunRuntime, RunStatus], Awaitable[None]]
_ENDED = (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.SUCCEEDED)


class Ending:
    """The end of one execution of ``run`` under ``lease``, by ``worker_id``."""

    def __init__(self, store: Store, run: RunRecord, lease: Lease, rt: RunRuntime, *, worker_id: str,
                 after_run: AfterRun | None, next_run: NextRun | None = None) -> None:
        self.store = store
        self.run = run
        self.lease = lease
        self.rt = rt
        self.worker_id = worker_id
        self.after_run = after_run
        self.next_run = next_run  # the run it continues as, if it does: created by the final commit

    async def settle(self, wf: asyncio.Task[Any]) -> list[OperationRecord] | None:
        """Await the workflow task and record how it ended: the journal's rows, None if nothing was written."""
        changes = await self._outcome(wf)
        if changes is None:
            return None
        await self._commit(changes)
        return self.rt.rows

    async def _outcome(self, wf: asyncio.Task[Any]) -> dict[str, Any] | None:
        """The run's changes for how the workflow task ended (None: nothing more to write)."""
        rt = self.rt
        changes: dict[str, Any]
        try:
            result = await wf
            rt.check_all_reached()  # raises NonDeterminismError for a recorded op the code skipped
        except Suspend as s:
            await rt.drain()
            pending = [p["id"] for p in rt.pending_callbacks()]
            changes = {"status": RunStatus.WAITING, "wake_at": wake_at(rt, s), "pending_callbacks": pending}
            rt.emit("run.waiting", callbacks=pending, wakeAt=changes["wake_at"])
        except asyncio.CancelledError:
            reason = await rt.cancel_requested()
            if reason is None:
                # Interrupted, not cancelled (Ctrl-C, SIGTERM, shutdown): sandbox sessions have
                # hibernated; the run goes back to pending, resumable here or by any worker.
                await self.leave_pending("run.interrupted")
                raise
            changes = {"status": RunStatus.CANCELLED, "error": ErrorInfo("RunCancelled", reason)}
            rt.emit("run.cancelled", reason=reason)
        except LeaseLost:
            log.warning("lost the lease on run %s; stopping without writing", self.run.run_id)
            return None
        except Handover as h:
            await rt.drain()
            await self.leave_pending("run.handed_over", reason=h.why)
            return None
        except StoreError:
            # The store cannot record (damaged, refusing, gone): not the workflow's failure, and nothing
            # more can be written anyway. The caller says why; the run goes on from its journal later.
            raise
        except Exception as exc:
            rt.draining = True
            await rt.drain()
            changes = {"status": RunStatus.FAILED, "error": ErrorInfo.from_exception(exc)}
            rt.emit("run.failed", error=str(exc))
        else:
            changes = {
                "status": RunStatus.SUCCEEDED,
                "result": to_jsonable(result, what=f"The result of workflow {self.run.workflow!r}"),
            }
            rt.emit("run.succeeded")
        return changes

    async def _commit(self, changes: dict[str, Any]) -> None:
        """The final commit: what is deferred, the run's new status and its thread state, in one commit."""
        rt, run_id, fence = self.rt, self.run.run_id, self.lease.fence
        if self.after_run is not None and changes["status"] in _ENDED:
            await self.after_run(rt, changes["status"])
        final = await rt.pending_records()
        nxt = self.next_run if changes["status"] == RunStatus.SUCCEEDED else None
        # Held like any write of the run: the last call's result rides on this commit.
        await commit_holding(self.store, run_id, fence, Commit(final, run=changes, thread_state=rt.state_change()),
                             rt.refusal_hold, released=lambda: rt.handover is not None,
                             new_run=nxt.record if nxt is not None else None)
        if nxt is not None:
            nxt.created(run_id)
        rt.rows.extend(final)
        rt.committed(final)
        if changes["status"] == RunStatus.WAITING and changes["pending_callbacks"]:
            # A signal that raced the run into waiting makes it runnable again.
            signals = await self.store.get_signals(run_id)
            if any(cb in signals for cb in changes["pending_callbacks"]):
                await self.store.update_run(run_id, {"status": RunStatus.PENDING}, fence=fence)
        await rt.flush_events()

    async def leave_pending(self, event: str, **data: Any) -> None:
        """Leave the run runnable for the next worker: completed records committed, status pending;
        the caller releases the lease."""
        rt = self.rt
        rt.emit(event, worker=self.worker_id, **data)
        try:
            final = await rt.pending_records()
            await self.store.commit(rt.run_id, self.lease.fence, Commit(final, run={"status": RunStatus.PENDING}))
            rt.committed(final)
            await rt.flush_events()
        except LeaseLost:
            pass  # another worker has it already


def wake_at(rt: RunRuntime, s: Suspend) -> float | None:
    """When a waiting run is due: the soonest of the suspension's wake time and its open deadlines and timers."""
    times = [s.wake_at] if s.wake_at is not None else []
    for rec in rt.latest.values():
        if rec.status == "started" and rec.meta:
            for key in ("deadline", "wakeAt"):
                if rec.meta.get(key) is not None:
                    times.append(float(rec.meta[key]))
    return min(times) if times else None
