"""The store protocol: everything the engine needs from persistence.

Implementations: ``stores.sqlite.SqliteStore`` (embedded default) and ``kube.store.KubernetesStore``;
``stores.testing.StoreContractSuite`` is the test suite every implementation must pass.
The engine defines the protocol so that it depends on no store (imports flow one way).

Contract highlights:
- ``commit`` is atomic: its journal rows, run changes, thread state and cache entry land together or
  not at all, and only while ``fence`` is still the run's current fencing token (else ``LeaseLost``).
- Leases fence: every successful ``claim`` increments the run's fence, so a worker that lost its lease
  can never write again even if it does not know yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.records import Commit, Event, Lease, OperationRecord, RunRecord, RunStatus


@runtime_checkable
class Store(Protocol):
    async def create_run(self, run: RunRecord) -> tuple[RunRecord, bool]:
        """Insert ``run`` unless its id exists; returns (stored run, created)."""
        ...

    async def get_run(self, run_id: str) -> RunRecord | None: ...

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]: ...

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        """Change run fields; with ``fence``, only while that fence is current (else ``LeaseLost``)."""
        ...

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        """Delete the run with its journal, events and signals, atomically; False if there is no such run.
        With ``fence``, only while that fence is current (else ``LeaseLost``): callers claim the run's lease
        first, so a run is never deleted under a worker executing it. Thread state and cache entries are
        shared between runs and stay. Deleting says nothing to providers: finalize the run's sandboxes first."""
        ...

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        """Every journal row of the run in commit order."""
        ...

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None: ...

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        """Take the run's lease (free, expired or already ours); raises ``LeaseHeld`` otherwise.
        ``take_over_from``: also take it while it is held, unexpired, by exactly that owner (one the
        caller proved dead); if someone else holds it by then, ``LeaseHeld`` as usual."""
        ...

    async def renew(self, lease: Lease, ttl: float) -> Lease: ...

    async def release(self, lease: Lease) -> None: ...

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None,
                         build: BuildClaims | None = None) -> Lease | None:
        """Claim a runnable run: pending, due (waiting with wake_at reached), or orphaned (running, lease expired);
        of ``workflows`` when given; with ``build``, only one a worker of that build may take (its
        ``BuildClaims.admits``, engine/builds.py): a run pinned to another build is never handed out."""
        ...

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        """Store a signal; True if new, False if the same value was already stored; ``SignalConflict`` if different."""
        ...

    async def get_signals(self, run_id: str) -> dict[str, Any]: ...

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        """(value, created_at) of an unexpired entry."""
        ...

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int: ...

    async def get_thread_state(self, thread_id: str) -> Any: ...

    async def append_events(self, events: Sequence[Event]) -> None: ...

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]: ...

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]: ...

    async def close(self) -> None: ...


@runtime_checkable
class CommitsWithNewRun(Protocol):
    """A store that can end one run and create the next in one transaction (``ctx.continue_as_new``: the old
    run's final commit and the next run's creation land together or not at all). Optional: the engine falls back
    to ``create_run`` then ``commit`` for a store without it (``engine.continue_as_new.commit_ending``)."""

    async def commit_with_new_run(self, run_id: str, fence: int, commit: Commit, new_run: RunRecord) -> None:
        """``commit`` (atomic and fenced as ``Store.commit``) and, in the same transaction, insert ``new_run``.
        If a run of its id exists already it is kept when it is the same run (same workflow, input and labels:
        a commit offered again) and the whole commit is refused with ``RunConflict`` otherwise."""
        ...


async def commit_ending(store: Store, run_id: str, fence: int, commit: Commit, new_run: RunRecord | None) -> None:
    """``commit``, and with ``new_run`` that run created in the same transaction where the store can
    (``CommitsWithNewRun``); elsewhere created first (``create_run``, idempotent), then the commit."""
    if new_run is None:
        await store.commit(run_id, fence, commit)
    elif isinstance(store, CommitsWithNewRun):
        await store.commit_with_new_run(run_id, fence, commit, new_run)
    else:
        await store.create_run(new_run)
        await store.commit(run_id, fence, commit)
