"""Fork a run at call N: new runs whose sandbox workspace is the source's state after its call N.

Each fork is a run of its own (the source's workflow unless another is given, pending: a worker or
``engine.resume`` continues it from call N with whatever the code does next, the way Temporal's reset and
LangGraph's time travel do, with the workspace at N restored too). Its journal starts as
sandboxes/fork_journal.py says; then, under the fork's lease, its session copies the newest checkpoint of the
source at or before N into a snapshot of its own (when the provider copies snapshots) while it restores a new
sandbox from the source's, replays the calls after it in order with the outcome check (``onReplay`` honoured:
``skip`` is not executed again, ``ask`` asks), and lets the borrowed checkpoint go. The fork is then *ready*
(runnable), and only then does it take a snapshot of its own at N and delete its copy: the copy plus its
journaled calls since already make it recoverable (after a loss it restores the copy and replays them), so its
own snapshot at N only makes a later restore shorter and need not delay the fork.

Snapshot ownership: *each fork owns a snapshot first*. No run ever deletes another's snapshot, and no run's
deletion waits on another's: a run's finalizer needs only its own journal (no reference counts kept across runs
that different people may own and delete in any order). The cost is one snapshot copy per fork. The source's
checkpoint is needed only while a fork is being made; if its owner deletes it meanwhile, the fork's copy or
restore fails and the fork is undone (nothing half-made), and can be asked for again. A maker killed between
"ready" and "own snapshot recorded" leaves a snapshot journaled ``started``: whoever next opens the session (its
run going on, or its finalizer) takes it again under the same provider operation id (the same object) and
records it, so it is deleted like every other (sandboxes/checkpoints.py, ``finish_interrupted``).

K forks of one point (``CHAIN_FORKS``, chosen by the node profile: docs/benchmarks.md, "Fork a run at call N"): the
first is made as above and takes its own snapshot at N at once; the others, made at the same time (at most
``FORKS_AT_ONCE``), copy and restore that snapshot, with nothing to replay and no snapshot to take after (their
copy is at N). Without ``CHAIN_FORKS`` all K start from the source's checkpoint at once, each replaying the calls
since it: on the 2-core test node, ten S3 copies, ten restores and fifty calls at once were slower.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
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

__all__ = ["ForkDiverged", "ForkPlace", "ForkRefused", "ForkRunExists", "Forked", "OnReady", "fork_run", "undo_fork"]

log = logging.getLogger(__name__)

FORK_LABEL = "durable-sandbox.dev/fork-of"
_SHOWN = 400  # characters of each stream an error shows
# The forks of one fork_run call made at the same time. Each is a sandbox start plus a restore stream (Pods on one
# kubelet); the bound keeps a count=100 from starting a hundred Pods at once against one API server and kubelet,
# and lets ten (issue 36's case) start together: made in turn, ten restores would cost ten Pod starts in a row.
FORKS_AT_ONCE = 10
# K forks of one point: True, the first is made, takes its own snapshot at N, and the others copy and restore that
# (nothing to replay, no snapshot after); False, all start from the source's checkpoint at once (each replays the
# calls since it, then snapshots). Chosen by the node profile: ten chained were ready in 12.1 s, ten at once in
# 16.9 s, in the same run (ten S3 copies and ten restores at once contend for the 2 cores; docs/benchmarks.md).
CHAIN_FORKS = True


class Engine(Protocol):
    """What a fork needs of the engine (``durable_sandbox.Engine`` is one)."""

    @property
    def store(self) -> Store: ...

    client: RunClient
    executor: RunExecutor

    def sandbox_provider(self, name: str) -> SandboxProvider: ...


class ForkSession(SandboxSession):
    """A fork's session while the fork is being made: the steps only a fork takes."""

    async def build(self) -> None:
        """Restore a new sandbox from the newest checkpoint and replay the calls since, outcomes checked; when
        that checkpoint is borrowed and the provider copies snapshots, copy it into a snapshot of the fork's own
        meanwhile (the copy and the restore overlap), journal the copy as the fork's and let the borrowed one go
        (journaled only). From then on the fork reads nothing its source may delete; each snapshot object has
        one owner, who deletes it once. A copy made is recorded even when the restore fails or waits for an
        ``ask`` answer: the undo (or the resumed restore) finds it."""
        latest = self.state.latest
        copying = None
        if latest is not None and latest.borrowed and self.provider.capabilities().supports(Capability.SNAPSHOT_COPY):
            copying = await self._start_copy(latest)
        try:
            await self.recoverer.restore(reason=fork_journal.FORK_OP)
        except BaseException:
            if copying is not None:
                with contextlib.suppress(Exception):
                    await self._record_copy(*copying)
            raise
        if copying is not None:
            await self._record_copy(*copying)

    async def own_borrowed(self) -> None:
        """Only the copy (a Sandbox fork's, sessions/fork_restore.py, whose restore its controller makes): when the
        newest checkpoint is borrowed and the provider copies snapshots, copy it into a snapshot of the fork's own,
        journal it as the fork's, and let the borrowed one go (journaled only)."""
        latest = self.state.latest
        if latest is not None and latest.borrowed and self.provider.capabilities().supports(Capability.SNAPSHOT_COPY):
            await self._record_copy(*await self._start_copy(latest))

    async def _start_copy(self, latest: Checkpoint) -> tuple[Checkpoint, str, dict[str, object], asyncio.Task[str]]:
        sc = self.scope
        op_id = f"{self.sid}/snapshot/copy-{latest.count}"
        provider_op = "dsv1c_" + hashlib.sha256(f"{self.rt.run_id}\0{op_id}".encode()).hexdigest()[:40]
        meta: dict[str, object] = {"count": latest.count, "operationId": provider_op, "copyOf": latest.snapshot_id}
        if not sc.done(op_id):
            await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "started", meta=meta)
        task = asyncio.ensure_future(self.provider.copy_snapshot(latest.snapshot_id, operation_id=provider_op))
        return latest, op_id, meta, task

    async def _record_copy(self, borrowed: Checkpoint, op_id: str, meta: dict[str, object],
                           copying: asyncio.Task[str]) -> None:
        sc = self.scope
        copy_id = await copying
        faults.reach(f"snapshot-copied:{op_id}")
        if not sc.done(op_id):
            await sc.write(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "completed", result={"snapshotId": copy_id},
                           meta=dict(meta))
            self.state.checkpoints.append(Checkpoint(borrowed.count, copy_id, op_id))
        await self.checkpointer.delete(borrowed)

    async def checkpoint_own(self) -> None:
        """Snapshot the workspace now (the fork is ready already), then delete the copy it was restored from and
        let go of any borrowed checkpoint left (journaled only: their owner deletes them)."""
        faults.reach(f"fork-settling:{self.rt.run_id}")
        latest = self.state.latest
        if latest is None or latest.borrowed or latest.count != self.state.completed:  # else its copy is at N
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


OnReady = Callable[[Forked], Awaitable[None]]


@dataclass
class _Made:
    """A fork ready (runnable), still under its maker's lease: its own snapshot at the fork point is next."""

    fork_id: str
    lease: Lease
    session: ForkSession | None  # None: it waits for ``ask`` answers (its restore goes on when answered)


async def fork_run(
    engine: Engine, run_id: str, *, after_call: int, count: int = 1, session: str | None = None,
    workflow: Any = None, input: Any = None, run_ids: Sequence[str] | None = None, place: ForkPlace | None = None,
    on_ready: OnReady | None = None,
) -> Forked:
    """Make ``count`` forks of run ``run_id`` at its call ``after_call`` (see the module's docstring).
    A fork whose replay diverges raises :class:`ForkDiverged` and every fork of this call is undone.
    ``on_ready`` is awaited once every fork is ready (runnable), before their own snapshots are taken; this
    returns once those are taken too (a fork whose own snapshot failed is still made: see ``_settle``)."""
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
    point = fork_journal.restore_point(state.checkpoints, after_call, engine.sandbox_provider(state.provider))
    borrowed = Borrowed(point.count, point.snapshot_id, run_id) if point is not None else None
    made = Forked(ids, run_id, after_call, sid, restored_from=borrowed.snapshot_id if borrowed else None)
    gate = asyncio.Semaphore(FORKS_AT_ONCE)
    ready: list[_Made] = []

    async def one(fork_id: str, start: Borrowed | None) -> None:
        async with gate:
            prefix = fork_journal.fork_prefix(rows, source_run=run_id, sid=sid, after_call=after_call,
                                              borrowed=start, origin=place.origin)
            ready.append(await _make_one(engine, source, fork_id, prefix, sid, (workflow, input), made, place))

    async def make(fork_ids: Sequence[str], start: Borrowed | None) -> None:
        outcomes = await asyncio.gather(*(one(fork_id, start) for fork_id in fork_ids), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]

    try:
        try:
            if CHAIN_FORKS and count > 1 and borrowed is not None:
                await make(ids[:1], borrowed)
                own = await _own_point(ready[0], after_call)
                await make(ids[1:], Borrowed(after_call, own, ids[0]) if own is not None else borrowed)
            else:
                await make(ids, borrowed)
        except BaseException:
            undone = list(ready)
            ready.clear()  # nothing of them to settle
            await _release(engine, undone)
            for m in undone:
                with contextlib.suppress(Exception):
                    await undo_fork(engine, m.fork_id)
            raise
        if on_ready is not None:
            await on_ready(made)
    finally:
        await asyncio.gather(*(_settle(engine, m, gate) for m in ready))
    return made


async def _own_point(first: _Made, after_call: int) -> str | None:
    """``CHAIN_FORKS``: the first fork (ready) takes its own snapshot at the fork point now, for the others to copy
    and restore with nothing to replay; None (they start from the source's checkpoint) if it cannot."""
    session, first.session = first.session, None  # settled here
    if session is None:
        return None
    try:
        await session.checkpoint_own()
    except Exception as exc:
        log.warning("fork %s: its own snapshot failed (%s); the other forks start from the source's checkpoint",
                    first.fork_id, exc)
        return None
    latest = session.state.latest
    return latest.snapshot_id if latest is not None and not latest.borrowed and latest.count == after_call else None


async def _settle(engine: Engine, m: _Made, gate: asyncio.Semaphore) -> None:
    """Fork ``m`` (ready) takes its own snapshot at the fork point, then its lease is let go. A failure here
    leaves the fork made and recoverable (its copy and journaled calls): logged, not raised; a snapshot left
    journaled ``started`` is taken again and recorded by whoever opens the session next."""
    try:
        if m.session is not None:
            async with gate:
                await m.session.checkpoint_own()
    except Exception as exc:
        log.warning("fork %s is ready, but its own snapshot at the fork point failed (%s); it stays recoverable "
                    "from its copy of the source's checkpoint and its journaled calls", m.fork_id, exc)
    finally:
        await _release(engine, [m])


async def _release(engine: Engine, made: Sequence[_Made]) -> None:
    for m in made:
        with contextlib.suppress(Exception):
            await engine.store.release(m.lease)


async def _make_one(
    engine: Engine, source: RunRecord, fork_id: str, prefix: list[OperationRecord], sid: str,
    program: tuple[Any, Any], made: Forked, place: ForkPlace,
) -> _Made:
    """Create fork ``fork_id``, build its workspace and make it runnable; returned still under its lease (the
    caller takes its own snapshot, then releases it). On any failure the fork is undone and its lease let go."""
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
            await session.build()
        except Suspend as waiting:  # an ``ask`` call: the run waits for the answer; the restore resumes then
            made.waiting_for[fork_id] = list(waiting.op_ids)
            await _ready(engine, fork_id, lease)
            return _Made(fork_id, lease, None)
        except ReconstructionError as diverged:
            raise ForkDiverged(made.source, made.after_call, diverged.op_id, diverged.recorded,
                               diverged.replayed) from None
        caps = session.provider.capabilities()
        restorable = caps.supports(Capability.SNAPSHOT) and caps.supports(Capability.RESTORE)
        if restorable and any(c.borrowed for c in session.state.checkpoints):
            # No copy of its own (a provider without ``snapshot_copy``): until its own snapshot is recorded the
            # fork would need its source's, so it is taken before the fork is ready, as the ownership rule says.
            await session.checkpoint_own()
            restorable = False
        await _ready(engine, fork_id, lease)
        return _Made(fork_id, lease, session if restorable else None)
    except BaseException:
        try:
            await _undo_claimed(engine, run, lease)
        finally:
            with contextlib.suppress(Exception):
                await engine.store.release(lease)
        raise


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
