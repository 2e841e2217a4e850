"""Fork a run at call N: new runs whose sandbox workspace is the source's state after its call N.

Each fork is a run of its own (the source's workflow unless another is given, pending: a worker or
``engine.resume`` continues it from call N with whatever the code does next, the way Temporal's reset and
LangGraph's time travel do, with the workspace at N restored too). Its journal starts as
sandboxes/fork_journal.py says; then, under the fork's lease, its session restores the newest checkpoint of
the source at or before N, replays the calls after it in order with the outcome check (``onReplay`` honoured:
``skip`` is not executed again, ``ask`` asks), and takes a snapshot of its own at N before letting the
borrowed checkpoint go.

Snapshot ownership: *each fork takes its own snapshot first*. No run ever deletes another's snapshot, and no
run's deletion waits on another's: a run's finalizer needs only its own journal (no reference counts kept
across runs that different people may own and delete in any order). The cost is one snapshot per fork. The
source's checkpoint is needed only while a fork is being made; if its owner deletes it meanwhile, the fork's
restore fails and the fork is undone (nothing half-made), and can be asked for again.

K forks of one point are made from one replay: the first fork restores and replays, then its own snapshot at
N is the checkpoint the others restore from (nothing to replay), when the provider takes snapshots. The others
are made concurrently (at most ``FORKS_AT_ONCE`` at a time): each copies and restores that one snapshot and takes
its own, so ten forks cost about one fork plus the slowest of the rest, not ten in a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from durable_sandbox.engine import faults
from durable_sandbox.engine.client import RunClient, new_run_id
from durable_sandbox.engine.errors import DurableError, RunNotFound, Suspend
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import Lease, OperationRecord, OpKind, RunRecord, RunStatus
from durable_sandbox.engine.store import Store
from durable_sandbox.providers.contract import Capability, SandboxProvider, ToolResult
from durable_sandbox.sandboxes import fork_journal
from durable_sandbox.sandboxes.fork_journal import Borrowed, ForkRefused
from durable_sandbox.sandboxes.session import ReconstructionError, SandboxSession, SessionState
from durable_sandbox.sandboxes.state import Checkpoint

__all__ = ["ForkDiverged", "ForkPlace", "ForkRefused", "ForkRunExists", "Forked", "fork_run", "undo_fork"]

FORK_LABEL = "durable-sandbox.dev/fork-of"
_SHOWN = 400  # characters of each stream an error shows
FORKS_AT_ONCE = 10  # the forks after the first of one fork_run call made at the same time


class Engine(Protocol):
    """What a fork needs of the engine (``durable_sandbox.Engine`` is one)."""

    @property
    def store(self) -> Store: ...

    client: RunClient
    executor: RunExecutor

    def sandbox_provider(self, name: str) -> SandboxProvider: ...


class ForkSession(SandboxSession):
    """A fork's session while the fork is being made: the two steps only a fork takes."""

    async def own_borrowed(self) -> None:
        """When the provider copies snapshots: copy the borrowed checkpoint into a snapshot of the fork's own, journal
        it as the fork's, and let the borrowed one go (journaled only). The restore then reads only what the fork
        owns, whatever the source deletes meanwhile; each snapshot object has one owner, who deletes it once."""
        latest = self.state.latest
        if latest is None or not latest.borrowed or not self.provider.capabilities().supports(Capability.SNAPSHOT_COPY):
            return
        sc = self.scope
        op_id = f"{self.sid}/snapshot/copy-{latest.count}"
        if not sc.done(op_id):
            provider_op = "dsv1c_" + hashlib.sha256(f"{self.rt.run_id}\0{op_id}".encode()).hexdigest()[:40]
            meta: dict[str, object] = {"count": latest.count, "operationId": provider_op, "copyOf": latest.snapshot_id}
            await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "started", meta=meta)
            copy_id = await self.provider.copy_snapshot(latest.snapshot_id, operation_id=provider_op)
            faults.reach(f"snapshot-copied:{op_id}")
            await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "completed", result={"snapshotId": copy_id},
                           meta=dict(meta))
            self.state.checkpoints.append(Checkpoint(latest.count, copy_id, op_id))
        await self.checkpointer.delete(latest)

    async def rebuild(self) -> None:
        """Restore the newest checkpoint (the fork's copy, else the borrowed one) and replay the calls since,
        outcomes checked."""
        await self.recoverer.restore(reason=fork_journal.FORK_OP)

    async def checkpoint_own(self) -> None:
        """Snapshot the workspace now, then let go of the borrowed checkpoints (journaled only: their owner
        deletes them): from then on the fork needs nothing of its source's."""
        await self.checkpointer.checkpoint(self.state.completed)
        for cp in [c for c in self.state.checkpoints if c.borrowed]:
            await self.checkpointer.delete(cp)


class ForkRunExists(ForkRefused):
    """The fork's run id is taken (another maker of the same fork, or a run of that id)."""


class ForkDiverged(DurableError):
    """Replaying the source's calls into the fork gave another outcome than the source's journal records."""

    def __init__(self, source: str, after_call: int, op_id: str, recorded: ToolResult, replayed: ToolResult) -> None:
        def shown(r: ToolResult) -> str:
            return f"exit {r.exit_code}, stdout {r.stdout[:_SHOWN]!r}, stderr {r.stderr[:_SHOWN]!r}"

        super().__init__(
            f"Fork of run {source!r} after call {after_call}: replaying call {op_id!r} diverged. Expected (the "
            f"source's journal): {shown(recorded)}. Actual (replayed): {shown(replayed)}. The call is not "
            f"deterministic (it reads the clock, the network, random data...); nothing was made. Journal it with "
            f"on_replay='skip' (onReplay: skip) if its effect is outside the workspace, or fork before it."
        )


@dataclass
class Forked:
    """What ``fork`` made: the new runs (pending) and, for a replay that waits on ``ask`` answers, which."""

    run_ids: list[str]
    source: str
    after_call: int
    session: str
    restored_from: str | None = None  # the source's snapshot the first fork was restored from (None: fresh)
    waiting_for: dict[str, list[str]] = field(default_factory=dict)  # run id -> replay callbacks to answer


CreateRun = Callable[[RunRecord], Awaitable[tuple[RunRecord, bool]]]


@dataclass(frozen=True)
class ForkPlace:
    """Where the forks go, for a maker that is not ``dsb fork`` (the operator's ``spec.forkOf``): the labels of
    the new runs (None: the source's), how a run is created (None: ``store.create_run``; the operator's owns
    it by its Workflow), what the fork record says of the source beside its run id (the operator: the
    source Workflow's name and uid), and the env of the fork's sandbox (its own, never the source's)."""

    labels: Mapping[str, str] | None = None
    create: CreateRun | None = None
    origin: Mapping[str, Any] | None = None
    env: Mapping[str, str] | None = None


async def fork_run(
    engine: Engine, run_id: str, *, after_call: int, count: int = 1, session: str | None = None,
    workflow: Any = None, input: Any = None, run_ids: Sequence[str] | None = None, place: ForkPlace | None = None,
) -> Forked:
    """Make ``count`` forks of run ``run_id`` at its call ``after_call`` (see the module's docstring).
    A fork whose replay diverges raises :class:`ForkDiverged` and every fork of this call is undone."""
    place = place or ForkPlace()
    if count < 1:
        raise ForkRefused(f"count must be >= 1, not {count}")
    ids = list(run_ids) if run_ids is not None else [new_run_id() for _ in range(count)]
    if len(ids) != count:
        raise ForkRefused(f"{count} forks asked for, {len(ids)} run ids given")
    source = await engine.store.get_run(run_id)
    if source is None:
        raise RunNotFound(run_id)
    rows = await engine.store.load_journal(run_id)
    sid = fork_journal.session_to_fork(rows, session)
    state = SessionState.derive(sid, rows)
    if state.provider is None:
        raise ForkRefused(f"Sandbox session {sid!r} of run {run_id!r} has no provider recorded; nothing to fork")
    provider = engine.sandbox_provider(state.provider)
    caps = provider.capabilities()
    restorable = caps.supports(Capability.SNAPSHOT) and caps.supports(Capability.RESTORE)
    point = fork_journal.restore_point(state.checkpoints, after_call, provider)
    borrowed = Borrowed(point.count, point.snapshot_id, run_id) if point is not None else None
    made = Forked(ids, run_id, after_call, sid, restored_from=borrowed.snapshot_id if borrowed else None)
    done: list[str] = []
    gate = asyncio.Semaphore(FORKS_AT_ONCE)

    async def one(fork_id: str, start: Borrowed | None) -> str | None:
        async with gate:
            prefix = fork_journal.fork_prefix(rows, source_run=run_id, sid=sid, after_call=after_call,
                                              borrowed=start, origin=place.origin)
            own = await _make_one(engine, source, fork_id, prefix, sid, (workflow, input), made, place)
            done.append(fork_id)
            return own

    try:
        own = await one(ids[0], borrowed)
        if own is not None and restorable:  # the other forks restore from the first one's snapshot
            borrowed = Borrowed(after_call, own, ids[0])
        outcomes = await asyncio.gather(*(one(fork_id, borrowed) for fork_id in ids[1:]), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]
    except BaseException:
        for fork_id in done:
            with contextlib.suppress(Exception):
                await undo_fork(engine, fork_id)
        raise
    return made


async def _make_one(
    engine: Engine, source: RunRecord, fork_id: str, prefix: list[OperationRecord], sid: str,
    program: tuple[Any, Any], made: Forked, place: ForkPlace,
) -> str | None:
    """Create fork ``fork_id`` and build its workspace; returns its own snapshot at the fork point (if any)."""
    workflow, input = program
    labels = {**(source.labels if place.labels is None else place.labels), FORK_LABEL: source.run_id}
    if workflow is None:  # the source's, as recorded (its module need not be imported here)
        record = RunRecord(run_id=fork_id, workflow=source.workflow, input=source.input if input is None else input,
                           labels=labels, workflow_ref=source.workflow_ref)
    else:
        record = engine.client.record(workflow, source.input if input is None else input, run_id=fork_id,
                                      labels=labels)
    # Created waiting on nothing: no worker drives a fork until it is ready (made pending at the end). A fork
    # whose maker died half-way stays so, and is removed by `delete` (its journal finds what it made).
    record.status = RunStatus.WAITING
    run, created = await (place.create or engine.store.create_run)(record)
    if not created:
        raise ForkRunExists(f"Run {fork_id!r} exists already; choose a new run id for the fork")
    lease = await engine.executor.claim(fork_id)
    try:
        rt = await engine.executor.open_runtime(run, lease)
        await rt.write(*prefix)
        st = SessionState.derive(sid, rt.known_rows())
        assert st.provider is not None
        options = st.options
        session = ForkSession(rt, sid, engine.sandbox_provider(st.provider), template=options.get("template"),
                              env=place.env,
                              lease_seconds=int(options.get("leaseSeconds", 3600)),
                              snapshot_every=int(options.get("snapshotEvery") or 0))
        try:
            await session.own_borrowed()
            await session.rebuild()
        except Suspend as waiting:  # an ``ask`` call: the run waits for the answer; the restore resumes then
            made.waiting_for[fork_id] = list(waiting.op_ids)
            await _ready(engine, fork_id, lease)
            return None
        except ReconstructionError as diverged:
            raise ForkDiverged(made.source, made.after_call, diverged.op_id, diverged.recorded,
                               diverged.replayed) from None
        own = None
        caps = session.provider.capabilities()
        if caps.supports(Capability.SNAPSHOT) and caps.supports(Capability.RESTORE):
            await session.checkpoint_own()
            latest = session.state.latest
            own = latest.snapshot_id if latest is not None and not latest.borrowed else None
        await _ready(engine, fork_id, lease)
        return own
    except BaseException:
        await _undo_claimed(engine, run, lease)
        raise
    finally:
        with contextlib.suppress(Exception):
            await engine.store.release(lease)


async def _ready(engine: Engine, fork_id: str, lease: Lease) -> None:
    """The fork is made: runnable from now on (a worker, ``engine.resume``, ``dsb resume``)."""
    faults.reach(f"fork-ready:{fork_id}")
    await engine.store.update_run(fork_id, {"status": RunStatus.PENDING}, fence=lease.fence)


async def undo_fork(engine: Engine, fork_id: str) -> None:
    """Remove fork ``fork_id`` and everything it made (a failed or half-made one); nothing of its source's."""
    run = await engine.store.get_run(fork_id)
    if run is None:
        return
    lease = await engine.executor.claim(fork_id)
    try:
        await _undo_claimed(engine, run, lease)
    finally:
        with contextlib.suppress(Exception):
            await engine.store.release(lease)


async def _undo_claimed(engine: Engine, run: RunRecord, lease: Lease) -> None:
    """Finalize the fork's session (its sandboxes destroyed, its own snapshots deleted; borrowed ones only
    let go), then delete the run: nothing of a fork that failed is left."""
    hooks = engine.executor.hooks
    if hooks is not None:
        await hooks.cancel_cleanup(engine.executor, run, lease)
    await engine.store.delete_run(run.run_id, fence=lease.fence)
