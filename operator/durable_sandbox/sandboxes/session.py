"""Sandbox sessions: the one mechanism behind ``ctx.sandbox`` and a Workflow manifest's ``toolCalls``.

A session journals every lifecycle operation under ``<session>/...`` and every tool call under
``<session>/<operation id>``. Its state (live sandbox, checkpoints, completed calls) is *derived from
the journal* (``state.py``), so a re-executed workflow (after a crash, a signal, hibernation) picks up exactly where
the journal says, and cleanup that runs without the workflow code (cancel, hibernation, the operator's
finalizer) works from the same derivation.

Order of effects, each journaled before the next begins:
- call: ``started`` -> provider.execute -> ``completed`` (a nonzero exit is a completed call) (this module);
- every ``snapshot_every`` calls: snapshot (stable op id) -> record its id -> delete the superseded one
  (``checkpoints.py``);
- loss (``SandboxGone`` or injected): restore the newest checkpoint (or provision fresh), replay every
  completed call since it in order with the original op ids (identical outcomes required), then retry
  what was interrupted; at most ``MAX_RECOVERIES`` per run (``recovery.py``). What a replay does with each call
  (``onReplay``: rerun, skip, ask) is ``replay_policy.py``'s;
- finalization: destroy the sandbox, delete every snapshot (except the retained one on success) (``teardown.py``).

The session composes those pieces over one ``SessionScope``; making and destroying sandboxes is
``provisioning.py``'s, retrying the provider ``retries.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import DurableError, Handover, LeaseLost, StoreRefused, Suspend
from durable_sandbox.engine.records import ErrorInfo, OperationRecord, OpKind
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.serialization import value_digest
from durable_sandbox.providers.contract import (
    SandboxHandle,
    SandboxProvider,
    ToolCall,
    ToolResult,
)
from durable_sandbox.sandboxes import fork_journal, journal
from durable_sandbox.sandboxes.call_failure import failure_message
from durable_sandbox.sandboxes.call_records import (
    derived_operation_id,
    journaled_args,
    result_from,
    result_json,
)
from durable_sandbox.sandboxes.call_scope import current_call_scope
from durable_sandbox.sandboxes.checkpoints import Checkpointer
from durable_sandbox.sandboxes.errors import (
    AttachedSandboxLost,
    CleanupFailed,
    ReconstructionError,
    RecoveryBudgetExhausted,
    ReplayAnswerInvalid,
    ToolCallFailed,
)
from durable_sandbox.sandboxes.journal import reserved_operation_id
from durable_sandbox.sandboxes.provisioning import Provisioner, sandbox_spec
from durable_sandbox.sandboxes.recovery import MAX_RECOVERIES, Recoverer
from durable_sandbox.sandboxes.replay_policy import ReplayPlanner
from durable_sandbox.sandboxes.scope import SessionScope
from durable_sandbox.sandboxes.services import SandboxServices
from durable_sandbox.sandboxes.session_checks import check_session
from durable_sandbox.sandboxes.state import Checkpoint, SessionState
from durable_sandbox.sandboxes.teardown import Teardown
from durable_sandbox.sandboxes.traced import traced_pieces, traced_session
from durable_sandbox.shell_args import shell_args

__all__ = [
    "DEFAULT_HIBERNATE_AFTER",
    "MAX_RECOVERIES",
    "AttachedSandboxLost",
    "Checkpoint",
    "CleanupFailed",
    "ReconstructionError",
    "RecoveryBudgetExhausted",
    "ReplayAnswerInvalid",
    "SandboxServices",
    "SandboxSession",
    "SessionState",
    "ToolCallFailed",
    "derived_operation_id",
    "journaled_args",
]

log = logging.getLogger("durable_sandbox.sandboxes")

DEFAULT_HIBERNATE_AFTER = 300.0  # seconds a waiting run keeps its sandbox, when the engine says nothing (DESIGN 6)


@traced_session  # spans for its calls when tracing is on (sandboxes/traced.py)
class SandboxSession:
    """``async with ctx.sandbox("workspace", provider="local", snapshot_every=10) as sbx: ...``"""

    def __init__(
        self,
        rt: RunRuntime,
        sid: str,
        provider: SandboxProvider,
        *,
        template: str | None = None,
        env: Mapping[str, str] | None = None,
        lease_seconds: int = 3600,
        snapshot_every: int = 0,
        retain_latest_snapshot: bool = False,
        inject_loss_after: int | None = None,
        suspend_between_calls: bool = False,
        hibernate_after: float | None = None,
        operation_ids: Sequence[str | None] | None = None,
        owner: str | None = None,
        attach: str | None = None,
        next_index: int = 0,
        keep_checkpoints: bool = False,
        state: SessionState | None = None,
    ) -> None:
        if snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, not {snapshot_every}")
        if inject_loss_after is not None and inject_loss_after < 1:
            raise ValueError(f"inject_loss_after must be >= 1, not {inject_loss_after}")
        self.rt = rt
        self.sid = sid
        self.provider = provider
        self.snapshot_every = snapshot_every
        self.keep_checkpoints = keep_checkpoints  # every checkpoint kept until the end: points to fork from
        self.retain_latest_snapshot = retain_latest_snapshot
        self.inject_loss_after = inject_loss_after
        self.suspend_between_calls = suspend_between_calls
        self.hibernate_after = hibernate_after if hibernate_after is not None else (
            rt.hibernate_after if rt.hibernate_after is not None else DEFAULT_HIBERNATE_AFTER)
        self.lease_seconds = lease_seconds
        self.spec = sandbox_spec(rt, sid, template=template, env=env, owner=owner, retain=retain_latest_snapshot)
        self._operation_ids = list(operation_ids or [])
        # Where a new call goes at the earliest (after every journaled one in any case): 0 for a workflow; a
        # Sandbox's own session (sessions/journal.py) is opened for one call at its place in the order.
        self._next_index = next_index
        # Calls the workflow's own code made (not a journaled step's: call_scope.py), in its order: what names a
        # call given no operation id, since that code issues them again, in the same order, on every execution.
        self._issued = next_index
        # One call at a time in the sandbox (an agent's concurrent tools): a call's index is its place in the order
        # the sandbox ran them, which is the order a rebuilt sandbox replays them in.
        self._one_at_a_time = asyncio.Lock()
        self._suspended = False
        self.scope = SessionScope.open(rt, sid, provider, state=state)  # ``state``: derived already, if given
        # The name of a Sandbox resource whose live sandbox this session uses instead of provisioning one:
        # never destroyed, hibernated or recovered here (the Sandbox's controller owns its lifecycle).
        self.provisioner = Provisioner(self.scope, self.spec, lease_seconds=lease_seconds, attach=attach)
        self.replays = ReplayPlanner(self.scope)
        self.recoverer = Recoverer(self.scope, self.provisioner, self.replays)
        self.checkpointer = Checkpointer(self.scope, self.recoverer)
        self.checkpointer.keep_all = keep_checkpoints
        self.teardown = Teardown(self.scope, self.provisioner, self.checkpointer)

    @property
    def state(self) -> SessionState:
        return self.scope.state

    @property
    def generation(self) -> int:
        return self.scope.generation

    @property
    def attach(self) -> str | None:
        return self.provisioner.attach

    # ------------------------------------------------------------------ public API

    def operation_id(self, index: int) -> str:
        given = self._operation_ids[index] if index < len(self._operation_ids) else None
        run = fork_journal.derivation_run(self.rt.first, self.rt.run_id, self.sid, index)  # a fork: its source's
        return given or derived_operation_id(run, self.sid, index)

    def _default_operation_id(self) -> str:
        """The id of the next call given none: ``<step op id>/sbx/<k>`` inside a journaled step (an agent's tool),
        else derived from its place among the calls the workflow's own code made."""
        scope = current_call_scope()
        return scope.next_operation_id() if scope is not None else self.operation_id(self._issued)

    def _index_of(self, op_id: str) -> int:
        """The call's place in the session's order: the one its journal record took (a replayed or retried call;
        a journaled step replayed without making its calls shifts nothing), else after every journaled call."""
        index = journal.call_index(prev) if (prev := self.rt.lookup(op_id)) is not None else None
        return index if index is not None else max(self._next_index, self.state.next_index)

    @property
    def handle(self) -> SandboxHandle | None:
        return self.state.handle

    async def call(self, call: ToolCall, *, fails: Callable[[ToolResult], str | None] | None = None,
                   on_replay: str = journal.ON_REPLAY_RERUN, read_only: bool = False) -> ToolResult:
        """Execute ``call`` (or return its recorded outcome). ``fails`` judges the outcome: a reason fails the
        call (journaled as failed, :class:`ToolCallFailed` raised), so the run fails and a retry of the run
        executes it again; None (the default for every outcome) makes it a completed call.

        ``on_replay`` says what rebuilding the sandbox after a loss does with this call once it completed:
        ``rerun`` it (the default), ``skip`` it (its journaled result stands; the rebuilt workspace lacks its
        changes: for calls whose effect is outside the workspace) or ``ask`` (wait on the callback
        ``replay:<op id>``, answered rerun or skip). It is journaled with the call when it first runs, and
        that is what a replay follows.

        ``read_only``: the caller vouches that the call cannot change the workspace (a Sandbox's ``read_file`` and
        ``list``, built by the operator): only its completion is journaled (one write instead of two), and a
        rebuild never runs it again (``on_replay`` does not apply). Interrupted, it leaves no trace, so a retry
        runs it again (it changed nothing) and the sandbox it ran in stays known."""
        journal.check_on_replay(on_replay, f"Sandbox {self.sid!r}, call {call.operation_id!r}")
        if current_call_scope() is None:
            self._issued += 1
        if reserved_operation_id(call.operation_id):
            raise ValueError(f"Sandbox {self.sid!r}: operation id {call.operation_id!r} is reserved; choose another id")
        async with self._one_at_a_time:
            return await self._call(call, fails=fails, on_replay=on_replay, read_only=read_only)

    async def _call(self, call: ToolCall, *, fails: Callable[[ToolResult], str | None] | None,
                    on_replay: str, read_only: bool = False) -> ToolResult:
        op_id = journal.call_id(self.sid, call.operation_id)
        index = self._index_of(op_id)
        if call.args.get("env"):  # env values the journal does not keep: the call itself, for a replay; any other
            self.replays.calls[op_id] = call  # the journal holds as issued (a long session keeps no copy of each)
        digest = value_digest([call.type, call.args])
        prev = self.rt.enter(op_id, OpKind.SANDBOX_CALL.value, call.type, digest)
        if prev is not None and prev.status == "failed" and prev.epoch >= self.rt.epoch:
            raise ToolCallFailed(prev.error.message if prev.error else f"call {op_id} failed")
        if prev is not None and prev.status == "completed":
            result = result_from(prev.result)
            self.state.calls[index] = (op_id, prev.result)
            if self.state.finalized:
                return result  # replaying a session whose block already ended: nothing more to do
        elif self.state.finalized:
            raise DurableError(f"Sandbox {self.sid!r} was already finalized; open a new session for more calls")
        else:
            result = await self._run(call, index, op_id, digest, prev, fails=fails, on_replay=on_replay,
                                     read_only=read_only and prev is None)
        await self._after_call(index + 1)
        return result

    async def _run(self, call: ToolCall, index: int, op_id: str, digest: str, prev: OperationRecord | None, *,
                   fails: Callable[[ToolResult], str | None] | None, on_replay: str,
                   read_only: bool = False) -> ToolResult:
        """Journal call ``index`` started (unless a crash left it so, or it is read-only), execute it, journal its
        outcome."""
        recorded = {"type": call.type, "args": journaled_args(call.args)}
        if read_only or prev is None or prev.status == "failed":  # new, or failed in an earlier attempt of the run
            meta = {"index": index, "operationId": call.operation_id, journal.META_CALL: recorded}
            if read_only:  # no started record: its completion says what it was (see :meth:`call`)
                on_replay = journal.ON_REPLAY_SKIP
            else:
                if on_replay != journal.ON_REPLAY_RERUN:  # absent means rerun: plain calls' journals stay as they were
                    meta[journal.META_ON_REPLAY] = on_replay
                await self.scope.write(op_id, OpKind.SANDBOX_CALL, call.type, "started", digest=digest, meta=meta,
                                       check_cancel=True)
            self.state.policies[op_id] = on_replay
            self.state.took(index)
        # Capped here, whatever the provider returned: the caller sees what the journal keeps, so a
        # replay returns the same result as the first execution.
        faults.reach(f"before:{op_id}")
        result = (await self.recoverer.guarded(lambda: self._execute(call))).capped()
        sandbox_id = self.state.handle.id if self.state.handle else None
        done: dict[str, Any] = {journal.META_INDEX: index, journal.META_OPERATION_ID: call.operation_id,
                                journal.META_SANDBOX_ID: sandbox_id}
        if read_only:
            done.update({journal.META_CALL: recorded, journal.META_READ_ONLY: True})
        reason = fails(result) if fails is not None else None
        if reason is not None:
            failure = ToolCallFailed(failure_message(reason, call, result, self.spec.env.values()))
            await self.scope.write(op_id, OpKind.SANDBOX_CALL, call.type, "failed", digest=digest,
                                   error=ErrorInfo.from_exception(failure, retryable=False),
                                   meta={**done, "outcome": result_json(result)})
            raise failure
        # Deferred: committed with the run's next write (the next call's start, a snapshot, the final
        # commit), so a call costs one commit; ``after:<op>`` is reached once it has landed.
        journaled = result_json(result)
        await self.scope.write(op_id, OpKind.SANDBOX_CALL, call.type, "completed", digest=digest,
                               result=journaled, meta=done, defer=True)
        self.state.calls[index] = (op_id, journaled)
        return result

    async def shell(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                    env: Mapping[str, str] | None = None, operation_id: str | None = None,
                    on_replay: str = journal.ON_REPLAY_RERUN) -> ToolResult:
        """Run ``command``; ``on_replay``: see :meth:`call`."""
        args = shell_args(command, timeout, cwd, env)
        return await self.call(ToolCall(operation_id=operation_id or self._default_operation_id(), type="shell", args=args),
                               on_replay=on_replay)

    async def write_file(self, path: str, contents: str, *, operation_id: str | None = None,
                         on_replay: str = journal.ON_REPLAY_RERUN) -> ToolResult:
        return await self.call(
            ToolCall(operation_id=operation_id or self._default_operation_id(), type="write_file",
                     args={"path": path, "contents": contents}),
            on_replay=on_replay,
        )

    async def read_file(self, path: str, *, operation_id: str | None = None,
                        on_replay: str = journal.ON_REPLAY_RERUN) -> ToolResult:
        return await self.call(
            ToolCall(operation_id=operation_id or self._default_operation_id(), type="read_file", args={"path": path}),
            on_replay=on_replay,
        )

    def result(self) -> dict[str, Any]:
        calls = [self.state.calls[i] for i in sorted(self.state.calls)]
        return {
            "sandboxId": self.state.newest,
            "provider": self.provider.name,
            "toolResults": [{"operationId": self.scope.local(op), **result_json(result_from(res))} for op, res in calls],
            "latestSnapshot": self.state.retained,
            "recoveryCount": self.state.recoveries,
        }

    # ------------------------------------------------------------------ context manager

    async def __aenter__(self) -> SandboxSession:
        check_session(self.sid, self.rt.run_id, self.provider, journaled_provider=self.state.provider,
                      operation_ids=self._operation_ids, inject_loss_after=self.inject_loss_after,
                      suspend_between_calls=self.suspend_between_calls, snapshot_every=self.snapshot_every,
                      lease_seconds=self.lease_seconds)
        if self.state.finalized:
            return self
        rec = self.rt.lookup(journal.provision_id(self.sid))
        if rec is None or rec.status != "completed":
            await self.provisioner.provision(rec, self._options())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, Suspend):
            if self.hibernate_after <= 0:
                await self.hibernate()
            return
        if exc is not None and isinstance(exc, LeaseLost | Handover | StoreRefused):
            # Another worker owns (or is about to continue) the run, and the live sandbox with it; or the store
            # refuses to record (a quota): the run is not over, and finalizing now would destroy the sandbox the
            # resumed run re-attaches to (or record it finalized, so that the resumed run could not go on).
            return
        if isinstance(exc, asyncio.CancelledError) and not await self.rt.cancel_requested():
            # Interrupted (Ctrl-C, SIGTERM, the process shutting down), not cancelled: the run is not
            # over, so keep the session resumable. The call in flight was abandoned (its processes are
            # killed); it runs again on resume, as after a crash.
            try:
                await self.hibernate()
            except Exception as err:  # the journal still names the live sandbox: resume re-attaches to it
                log.warning("sandbox %s: could not hibernate on interruption (%s); the sandbox is kept for "
                            "the resumed run (its provider lease is the backstop)", self.sid, err)
            return
        succeeded = exc is None
        await self.finalize(succeeded=succeeded)

    def _options(self) -> dict[str, Any]:
        # Never the env: it may hold secrets.
        return {
            "template": self.spec.template,
            "leaseSeconds": self.lease_seconds,
            "snapshotEvery": self.snapshot_every,
            "retainLatestSnapshot": self.retain_latest_snapshot,
            "injectLossAfter": self.inject_loss_after,
            "attach": self.attach,
            "keepCheckpoints": self.keep_checkpoints,
        }

    # ------------------------------------------------------------------ a call's sandbox, and what follows a call

    async def _execute(self, call: ToolCall) -> ToolResult:
        handle = await self.recoverer.live_handle()
        if self.suspend_between_calls and self._suspended:
            handle = await self.provider.resume(handle)
            self._suspended = False
        result = await self.provider.execute(handle, call)
        if self.suspend_between_calls:
            await self.provider.suspend(handle)
            self._suspended = True
        return result

    async def _after_call(self, count: int) -> None:
        # While replaying calls completed further on (a re-opened session), no sandbox holds exactly
        # ``count`` calls: only recorded checkpoints apply, nothing new is taken or injected.
        current = count >= self.state.completed
        if self.snapshot_every and count % self.snapshot_every == 0:
            await self.checkpointer.checkpoint(count, fresh=current)
        if self.inject_loss_after is not None and count == self.inject_loss_after and current:
            await self.recoverer.inject_loss(count)
        if current and self.state.handle is None and self.recoverer.interrupted():
            # A recovery that waited for an answer (ask) or was cut short by a crash: finish it now, not at the
            # next call (there may be none: a loss after the last call still rebuilds the workspace).
            await self.recoverer.finish_interrupted()

    # ------------------------------------------------------------------ hibernation and finalization

    async def hibernate(self) -> bool:
        """Checkpoint and destroy the sandbox while the run waits; it is restored when the run goes on."""
        return await self.teardown.hibernate()

    async def finalize(self, *, succeeded: bool) -> None:
        await self.teardown.finalize(succeeded=succeeded, retain_latest_snapshot=self.retain_latest_snapshot)



traced_pieces(Provisioner, Checkpointer, Recoverer)  # spans for the lifecycle when tracing is on
