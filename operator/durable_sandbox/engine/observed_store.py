"""What a worker's store calls tell its metrics (``dsb worker --metrics-port``): :class:`ObservedStore` wraps the
store an engine executes over and tells a :class:`WorkerObserver` what its calls did.

Every write that matters passes through the store, so counting there needs no hook in the executor:

* a run claimed: the fenced write that marks a run running under the lease this worker claimed for it (once per
  execution; a claim taken only to hibernate a run, carry out a cancel, or give back a run of another build is
  not one);
* a run finished, by outcome: a commit (or a fenced ``update_run``) that set a terminal status;
* steps committed: the step records (completed or failed) in the commits that landed;
* a lease renewal failed: a ``renew`` that raised without the lease being lost (the store away, refused);
* a lease lost: a fenced call refused because another worker holds the run now (``LeaseLost``, not
  ``StoreUnavailable``), or the lease given up by this worker's lease keeper (no renewal succeeded before its
  safety point: :meth:`ObservedStore.gave_up`, engine/lease_keeper.py); each lease (run and fence) counted once,
  however many of its calls are refused after.

Runs skipped as pinned to another build are not store calls: the worker loops say them (:func:`observer_of`).
The observer is told after the call, never before, and its errors are not the run's: a counter cannot fail a
commit. It is given no run id (a metric label must stay bounded).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.errors import LeaseLost, StoreUnavailable
from durable_sandbox.engine.records import (
    Commit,
    Event,
    Lease,
    OperationRecord,
    OpKind,
    OpStatus,
    RunRecord,
    RunStatus,
)
from durable_sandbox.engine.store import CommitsWithNewRun, Store

__all__ = ["ObservedStore", "WorkerObserver", "observer_of"]

log = logging.getLogger("durable_sandbox.engine")

_REMEMBERED_LOSSES = 1024  # leases counted lost that a second refusal is recognised for


class WorkerObserver(Protocol):
    """Told what a worker's executions did (``kube.telemetry.worker_metrics.WorkerMetrics`` counts it)."""

    def claimed(self) -> None: ...

    def finished(self, outcome: str) -> None: ...

    def steps_committed(self, count: int) -> None: ...

    def renewal_failed(self) -> None: ...

    def lease_lost(self) -> None: ...

    def skipped_pinned(self) -> None: ...


def observer_of(store: Store) -> WorkerObserver | None:
    """The observer of ``store`` if it is an :class:`ObservedStore`."""
    return store.observer if isinstance(store, ObservedStore) else None


def _steps(records: Sequence[OperationRecord]) -> int:
    return sum(1 for r in records if r.kind == OpKind.STEP and r.status in (OpStatus.COMPLETED, OpStatus.FAILED))


def _outcome(changes: dict[str, Any] | None) -> str | None:
    status = (changes or {}).get("status")
    if status is None:
        return None
    status = RunStatus(status)
    return status.value if status.terminal else None


class ObservedStore:
    """``inner`` with what its calls did told to ``observer``; everything else is the inner store's."""

    def __init__(self, inner: Store, observer: WorkerObserver) -> None:
        self.inner = inner
        self.observer = observer
        # The leases (run id, fence) counted lost, the newest last: one lost lease refuses its renewal and then
        # the execution's last write; it is one lease lost. Bounded: the oldest are forgotten.
        self._lost: dict[tuple[str, int], None] = {}

    def __getattr__(self, attr: str) -> Any:
        # A store's own settings (``event_interval``, the Kubernetes store's namespace) are the inner store's.
        return getattr(self.inner, attr)

    def _tell(self, what: str, *args: Any) -> None:
        try:
            getattr(self.observer, what)(*args)
        except Exception:  # a metric must never fail a run
            log.exception("worker metrics: %s failed", what)

    def _refused(self, exc: BaseException, run_id: str, fence: int | None) -> None:
        if isinstance(exc, LeaseLost) and not isinstance(exc, StoreUnavailable) and fence is not None:
            self._lost_once(run_id, fence)

    def _lost_once(self, run_id: str, fence: int) -> None:
        if (run_id, fence) in self._lost:
            return
        self._lost[(run_id, fence)] = None
        while len(self._lost) > _REMEMBERED_LOSSES:
            del self._lost[next(iter(self._lost))]
        self._tell("lease_lost")

    def gave_up(self, lease: Lease) -> None:
        """The lease keeper gave ``lease`` up: no renewal succeeded before its safety point."""
        self._lost_once(lease.run_id, lease.fence)

    def _landed(self, commit: Commit) -> None:
        steps = _steps(commit.records)
        if steps:
            self._tell("steps_committed", steps)
        outcome = _outcome(commit.run)
        if outcome is not None:
            self._tell("finished", outcome)

    # -- the calls counted -------------------------------------------------------------------------

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        try:
            return await self.inner.renew(lease, ttl)
        except StoreUnavailable:
            self._tell("renewal_failed")
            raise
        except LeaseLost:
            self._lost_once(lease.run_id, lease.fence)
            raise
        except Exception:
            self._tell("renewal_failed")
            raise

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        try:
            await self.inner.commit(run_id, fence, commit)
        except Exception as exc:
            self._refused(exc, run_id, fence)
            raise
        self._landed(commit)

    async def commit_with_new_run(self, run_id: str, fence: int, commit: Commit, new_run: RunRecord) -> None:
        try:
            if isinstance(self.inner, CommitsWithNewRun):
                await self.inner.commit_with_new_run(run_id, fence, commit, new_run)
            else:  # engine/store.py commit_ending's fallback
                await self.inner.create_run(new_run)
                await self.inner.commit(run_id, fence, commit)
        except Exception as exc:
            self._refused(exc, run_id, fence)
            raise
        self._landed(commit)

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        try:
            await self.inner.update_run(run_id, changes, fence=fence)
        except Exception as exc:
            self._refused(exc, run_id, fence)
            raise
        if fence is None:
            return
        if changes.get("status") == RunStatus.RUNNING:  # an execution starts under this worker's claim
            self._tell("claimed")
        outcome = _outcome(changes)
        if outcome is not None:
            self._tell("finished", outcome)

    # -- the calls passed on as they are -----------------------------------------------------------

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        return await self.inner.claim(run_id, owner, ttl, take_over_from=take_over_from)

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None,
                         build: BuildClaims | None = None) -> Lease | None:
        pinned = {} if build is None else {"build": build}  # a Store of before builds takes no build
        return await self.inner.claim_next(owner, ttl, workflows=workflows, **pinned)

    async def create_run(self, run: RunRecord) -> tuple[RunRecord, bool]:
        return await self.inner.create_run(run)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.inner.get_run(run_id)

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        return await self.inner.list_runs(status=status, workflow=workflow, limit=limit)

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        return await self.inner.delete_run(run_id, fence=fence)

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self.inner.load_journal(run_id)

    async def release(self, lease: Lease) -> None:
        await self.inner.release(lease)

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        return await self.inner.put_signal(run_id, callback_id, value)

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        return await self.inner.get_signals(run_id)

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        return await self.inner.cache_get(key, now)

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        return await self.inner.cache_clear(key, prefix=prefix)

    async def get_thread_state(self, thread_id: str) -> Any:
        return await self.inner.get_thread_state(thread_id)

    async def append_events(self, events: Sequence[Event]) -> None:
        await self.inner.append_events(events)

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        return await self.inner.read_events(run_id, after, limit)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        return await self.inner.journal_since(run_id, after_seq)

    async def close(self) -> None:
        await self.inner.close()
