"""Sandbox sessions: the one mechanism behind ``ctx.sandbox`` and a Workflow manifest's ``toolCalls``.

A session journals every lifecycle operation under ``<session>/...`` and every tool call under
``<session>/<operation id>``. Its state (live sandbox, checkpoints, completed calls) is *derived from
the journal*, so a re-executed workflow (after a crash, a signal, hibernation) picks up exactly where
the journal says, and cleanup that runs without the workflow code (cancel, hibernation, the operator's
finalizer) works from the same derivation.

Order of effects, each journaled before the next begins:
- call: ``started`` -> provider.execute -> ``completed`` (a nonzero exit is a completed call);
- every ``snapshot_every`` calls: snapshot (stable op id) -> record its id -> delete the superseded one;
- loss (``SandboxGone`` or injected): restore the newest checkpoint (or provision fresh), replay every
  completed call since it in order with the original op ids (identical outcomes required), then retry
  what was interrupted; at most ``MAX_RECOVERIES`` per run. A call journaled with ``onReplay: skip`` is not
  executed again (its journaled result stands); one with ``ask`` waits on the callback ``replay:<op id>``
  first, *before* anything is made: the whole restore waits with no sandbox live, so a wait of days holds
  nothing and a crash while waiting leaks nothing;
- finalization: destroy the sandbox, delete every snapshot (except the retained one on success).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from durable_sandbox.engine import Context, faults
from durable_sandbox.engine.errors import DurableError, Handover, LeaseLost, StoreRefused, Suspend
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import ErrorInfo, Lease, OperationRecord, OpKind, RunRecord, RunStatus
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.serialization import value_digest
from durable_sandbox.providers.contract import (
    RETAIN_LABEL,
    Capability,
    ConfigurationError,
    ProviderError,
    ProvisionError,
    RateLimited,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
    ToolResult,
    UnsupportedCapability,
)
from durable_sandbox.providers.redaction import REDACTED
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.call_failure import failure_message
from durable_sandbox.sandboxes.journal import reserved_operation_id, sessions_in
from durable_sandbox.sandboxes.requirements import unmet

log = logging.getLogger("durable_sandbox.sandboxes")

T = TypeVar("T")

MAX_RECOVERIES = 3
TRANSIENT_ATTEMPTS = 6
CLEANUP_ATTEMPTS = 8
FIRST_RETRY_DELAY = 0.2  # seconds; doubles per attempt up to MAX_RETRY_DELAY
MAX_RETRY_DELAY = 5.0
MAX_RATE_LIMIT_WAIT = 300.0  # a provider's Retry-After is honoured up to this long per wait, then asked again
DEFAULT_HIBERNATE_AFTER = 300.0  # seconds a waiting run keeps its sandbox, when the engine says nothing (DESIGN 6)


class ReconstructionError(DurableError):
    def __init__(self, op_id: str, recorded: ToolResult, replayed: ToolResult) -> None:
        self.op_id = op_id
        super().__init__(
            f"Reconstruction operation {op_id} produced a different outcome. Recorded exit {recorded.exit_code}, "
            f"replayed exit {replayed.exit_code}"
            + ("; stdout differs" if recorded.stdout != replayed.stdout else "")
            + ("; stderr differs" if recorded.stderr != replayed.stderr else "")
            + ". The sandbox cannot be rebuilt faithfully (the calls are not deterministic); the run fails "
            "rather than continue on a different workspace."
        )


class RecoveryBudgetExhausted(DurableError):
    def __init__(self, session: str, budget: int) -> None:
        super().__init__(
            f"Sandbox session {session!r} was lost again after {budget} recoveries (the budget per run); "
            f"giving up. Check the provider's health or raise the sandbox lease."
        )


class CleanupFailed(DurableError):
    retryable = True




class ToolCallFailed(DurableError):
    """A tool call's outcome failed the run under its failure policy (not retried within the run)."""


class ReplayAnswerInvalid(DurableError):
    """An ``ask`` call's replay callback was answered with something else than rerun or skip."""

    def __init__(self, ask: str, value: Any) -> None:
        super().__init__(
            f"Callback {ask!r} was answered {value!r}; the answers are {' or '.join(repr(a) for a in journal.ANSWERS)} "
            f"(rerun: execute the call again into the rebuilt sandbox; skip: keep its journaled result). A signal "
            f"cannot be changed once given, so the run fails; re-create the Workflow (or run the manifest again "
            f"under a new run id) and answer rerun or skip."
        )




@dataclass(frozen=True)
class SandboxServices:
    """What the process driving runs tells their sandbox sessions (an extension value of the engine:
    ``Engine(extensions=[SandboxServices(...)])``; `dsb` gives none). The operator serves many Workflows from
    one process, so what differs per run is a function of the run id."""

    # run id -> the owner tag of its sandboxes (``<namespace>/<workflow uid>``; orphans are found by it)
    owner: Callable[[str], str | None] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # on every sandbox (the operator's installation)
    # (run id, Sandbox resource name) -> that resource's live sandbox, for a session that attaches to it
    attached: Callable[[str, str], Awaitable[SandboxHandle]] | None = None

    @staticmethod
    def of(rt: RunRuntime) -> SandboxServices:
        return rt.extensions.get(SandboxServices) or _NO_SERVICES


_NO_SERVICES = SandboxServices()


def derived_operation_id(run_id: str, session: str, index: int) -> str:
    digest = hashlib.sha256(f"{run_id}\0{session}\0{index}".encode()).hexdigest()
    return "dsv1_" + digest[:40]


def journaled_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments as the journal keeps them: env values replaced by a marker (they may be
    secrets, and the journal is stored and shown); the names stay, so `dsb history` says what was set."""
    env = args.get("env")
    if not isinstance(env, Mapping) or not env:
        return dict(args)
    return {**args, "env": dict.fromkeys(env, REDACTED)}


def _result_json(result: ToolResult) -> dict[str, Any]:
    """What the journal keeps of a result: output capped to its first and last 64 KiB per stream, with
    the full size of a truncated stream (``stdoutBytes``/``stderrBytes``)."""
    result = result.capped()
    data: dict[str, Any] = {"exitCode": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}
    if result.stdout_size is not None:
        data["stdoutBytes"] = result.stdout_size
    if result.stderr_size is not None:
        data["stderrBytes"] = result.stderr_size
    return data


def _result_from(data: Mapping[str, Any]) -> ToolResult:
    return ToolResult(exit_code=int(data["exitCode"]), stdout=data.get("stdout", ""), stderr=data.get("stderr", ""),
                      stdout_size=data.get("stdoutBytes"), stderr_size=data.get("stderrBytes"))


def _handle_json(handle: SandboxHandle) -> dict[str, Any]:
    return handle.model_dump(mode="json")


# ------------------------------------------------------------------------------------------ state


@dataclass
class Checkpoint:
    count: int  # completed calls the snapshot contains
    snapshot_id: str
    op_id: str


@dataclass
class SessionState:
    """What the journal says about one session."""

    sid: str
    provider: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    handle: SandboxHandle | None = None
    newest: str | None = None  # the newest sandbox the session made (a recovery's replacement): its result names it
    pending_handles: list[SandboxHandle] = field(default_factory=list)  # made but not yet adopted
    checkpoints: list[Checkpoint] = field(default_factory=list)
    calls: dict[int, tuple[str, ToolResult]] = field(default_factory=dict)  # index -> (op id, result)
    # call op id -> what a replay does with it (journal.ON_REPLAY_*), as its started record said
    policies: dict[str, str] = field(default_factory=dict)
    recoveries: int = 0
    recovery_attempts: int = 0  # recoveries begun and finished either way: what the budget counts
    restores: int = 0
    finalized: bool = False
    retained: str | None = None
    # (epoch, succeeded) of every finalization, oldest first: a session finalized because its run
    # failed is re-opened when the run is retried (a later epoch); see SandboxSession.__init__.
    finalizations: list[tuple[int, bool]] = field(default_factory=list)

    @property
    def completed(self) -> int:
        n = 0
        while n in self.calls:
            n += 1
        return n

    @property
    def latest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    @classmethod
    def derive(cls, sid: str, rows: Sequence[OperationRecord]) -> SessionState:
        st = cls(sid)
        prefix = sid + "/"
        for r in rows:
            if not r.op_id.startswith(prefix):
                continue
            meta = r.meta or {}
            if r.kind == OpKind.SANDBOX_PROVISION.value and r.status == "started":
                st.provider = meta.get("provider", st.provider)
                st.options = meta.get("options", st.options)
            if r.kind == OpKind.SANDBOX_CALL.value and (r.status == "started" or journal.META_CALL in meta):
                st.policies[r.op_id] = journal.on_replay(r)
            if r.status == "started" and meta.get("handle"):
                st.pending_handles.append(SandboxHandle.model_validate(meta["handle"]))
            if r.kind == OpKind.SANDBOX_RESTORE.value and r.status == "failed":
                st.restores += 1
                st.recovery_attempts += meta.get(journal.META_REASON) == journal.REASON_RECOVERY
            if r.status != "completed":
                continue
            if r.kind in (OpKind.SANDBOX_PROVISION.value, OpKind.SANDBOX_RESTORE.value):
                st.handle = SandboxHandle.model_validate(r.result)
                st.newest = st.handle.id
                st.pending_handles = [h for h in st.pending_handles if h.id != st.handle.id]
                if r.kind == OpKind.SANDBOX_RESTORE.value:
                    st.restores += 1
                    if journal.recovered(r):
                        st.recoveries += 1
                        st.recovery_attempts += 1
            elif r.kind == OpKind.SANDBOX_DESTROY.value:
                gone = meta.get(journal.META_SANDBOX_ID)
                if st.handle is not None and st.handle.id == gone:
                    st.handle = None
                st.pending_handles = [h for h in st.pending_handles if h.id != gone]
            elif r.kind == OpKind.SANDBOX_SNAPSHOT.value:
                st.checkpoints.append(Checkpoint(int(meta["count"]), r.result["snapshotId"], r.op_id))
            elif r.kind == OpKind.SANDBOX_SNAPSHOT_DELETE.value:
                st.checkpoints = [c for c in st.checkpoints if c.snapshot_id != journal.deletion_of(r)]
            elif r.kind == OpKind.SANDBOX_CALL.value:
                st.calls[int(meta["index"])] = (r.op_id, _result_from(r.result))
            if journal.finalized(r):
                st.finalized = True
                kept = journal.retained(r)
                st.retained = kept.snapshot_id if kept else None
                st.finalizations.append((r.epoch, bool(meta.get(journal.META_SUCCEEDED, True))))
        return st

    def reopen_for(self, epoch: int) -> int:
        """Re-open a session finalized because its run failed, when the run is retried (``epoch`` later
        than the failure's); returns the session's generation: how many failed finalizations precede
        this epoch. Nothing of the failed attempt's sandbox remains (finalization destroyed it and
        deleted its snapshots), so the next call rebuilds the workspace: a fresh sandbox, every
        completed call replayed in order with its outcome checked. A run that is never retried leaks
        nothing; one that is retried continues exactly as if it had not failed."""
        generation = sum(1 for e, ok in self.finalizations if not ok and e < epoch)
        if self.finalized and self.finalizations and not self.finalizations[-1][1] and self.finalizations[-1][0] < epoch:
            self.finalized = False
            self.retained = None
        return generation


# ------------------------------------------------------------------------------------------ session


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
    ) -> None:
        if snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, not {snapshot_every}")
        if inject_loss_after is not None and inject_loss_after < 1:
            raise ValueError(f"inject_loss_after must be >= 1, not {inject_loss_after}")
        self.rt = rt
        self.sid = sid
        self.provider = provider
        self.snapshot_every = snapshot_every
        self.retain_latest_snapshot = retain_latest_snapshot
        self.inject_loss_after = inject_loss_after
        self.suspend_between_calls = suspend_between_calls
        self.hibernate_after = hibernate_after if hibernate_after is not None else (
            rt.hibernate_after if rt.hibernate_after is not None else DEFAULT_HIBERNATE_AFTER)
        self.lease_seconds = lease_seconds
        # The name of a Sandbox resource whose live sandbox this session uses instead of provisioning one:
        # never destroyed, hibernated or recovered here (the Sandbox's controller owns its lifecycle).
        self.attach = attach
        services = SandboxServices.of(rt)
        self.spec = SandboxSpec(
            template=template,
            env=dict(env or {}),
            owner=owner or (services.owner(rt.run_id) if services.owner is not None else None) or "durable-sandbox-local",
            labels={
                # The operator adds its installation label (orphan sweeps list by it); snapshots keep them.
                **services.labels,
                **({RETAIN_LABEL: "true"} if retain_latest_snapshot else {}),
                "durable-sandbox.dev/run-id": rt.run_id, "durable-sandbox.dev/session": sid,
            },
        )
        self._operation_ids = list(operation_ids or [])
        self._calls: dict[str, ToolCall] = {}
        # Where the session's next call goes: 0 for a workflow (its code calls from the first again on replay);
        # a Sandbox's own session (sessions/journal.py) is opened for one call at its place in the order.
        self._next_index = next_index
        self.state = SessionState.derive(sid, rt.known_rows())
        self.generation = self.state.reopen_for(rt.epoch)
        self._suspended = False
        # The answers to this session's replay callbacks, once read (a second recovery in the same execution
        # reuses them: an answer is for the call, for the whole run). The callbacks are written only while
        # recovering, so a later execution that needs no recovery never meets them: not a change of code.
        self._answers: dict[str, str] = {}
        for ask in journal.asks_of(sid, rt.first):
            rt.reached(ask)

    # ------------------------------------------------------------------ public API

    def operation_id(self, index: int) -> str:
        given = self._operation_ids[index] if index < len(self._operation_ids) else None
        return given or derived_operation_id(self.rt.run_id, self.sid, index)

    @property
    def handle(self) -> SandboxHandle | None:
        return self.state.handle

    async def call(self, call: ToolCall, *, fails: Callable[[ToolResult], str | None] | None = None,
                   on_replay: str = journal.ON_REPLAY_RERUN, journal_start: bool = True) -> ToolResult:
        """Execute ``call`` (or return its recorded outcome). ``fails`` judges the outcome: a reason fails the
        call (journaled as failed, :class:`ToolCallFailed` raised), so the run fails and a retry of the run
        executes it again; None (the default for every outcome) makes it a completed call.

        ``on_replay`` says what rebuilding the sandbox after a loss does with this call once it completed:
        ``rerun`` it (the default), ``skip`` it (its journaled result stands; the rebuilt workspace lacks its
        changes: for calls whose effect is outside the workspace) or ``ask`` (wait on the callback
        ``replay:<op id>``, answered rerun or skip). It is journaled with the call when it first runs, and
        that is what a replay follows. ``journal_start=False``: one record per call, at completion (sessions/journal.py)."""
        journal.check_on_replay(on_replay, f"Sandbox {self.sid!r}, call {call.operation_id!r}")
        index = self._next_index
        self._next_index += 1
        if reserved_operation_id(call.operation_id):
            raise ValueError(f"Sandbox {self.sid!r}: operation id {call.operation_id!r} is reserved; choose another id")
        op_id = journal.call_id(self.sid, call.operation_id)
        self._calls[op_id] = call  # with its env values, which the journal does not keep (for replay)
        digest = value_digest([call.type, call.args])
        prev = self.rt.enter(op_id, OpKind.SANDBOX_CALL.value, call.type, digest)
        if prev is not None and prev.status == "failed" and prev.epoch >= self.rt.epoch:
            raise ToolCallFailed(prev.error.message if prev.error else f"call {op_id} failed")
        if prev is not None and prev.status == "completed":
            result = _result_from(prev.result)
            self.state.calls[index] = (op_id, result)
            if self.state.finalized:
                return result  # replaying a session whose block already ended: nothing more to do
        elif self.state.finalized:
            raise DurableError(f"Sandbox {self.sid!r} was already finalized; open a new session for more calls")
        else:
            meta = {"index": index, "operationId": call.operation_id,
                    "call": {"type": call.type, "args": journaled_args(call.args)}}
            if on_replay != journal.ON_REPLAY_RERUN:  # absent means rerun: journals of plain calls stay as they were
                meta[journal.META_ON_REPLAY] = on_replay
            if prev is None or prev.status == "failed":  # new, or failed in an earlier attempt of the run
                if journal_start:
                    await self._journal(op_id, OpKind.SANDBOX_CALL, call.type, "started", digest=digest, meta=meta,
                                        check_cancel=True)
                self.state.policies[op_id] = on_replay
            # Capped here, whatever the provider returned: the caller sees what the journal keeps, so a
            # replay returns the same result as the first execution.
            faults.reach(f"before:{op_id}")
            result = (await self._with_recovery(lambda: self._execute(call))).capped()
            sandbox_id = self.state.handle.id if self.state.handle else None
            reason = fails(result) if fails is not None else None
            if reason is not None:
                failure = ToolCallFailed(failure_message(reason, call, result, self.spec.env.values()))
                await self._journal(op_id, OpKind.SANDBOX_CALL, call.type, "failed", digest=digest,
                                    error=ErrorInfo.from_exception(failure, retryable=False),
                                    meta={journal.META_INDEX: index, journal.META_OPERATION_ID: call.operation_id, journal.META_SANDBOX_ID: sandbox_id,
                                          "outcome": _result_json(result)})
                raise failure
            # Deferred: rides on the run's next commit (one commit per call); ``after:<op>`` is reached once it lands.
            done = {journal.META_INDEX: index, journal.META_OPERATION_ID: call.operation_id, journal.META_SANDBOX_ID: sandbox_id}
            await self._journal(op_id, OpKind.SANDBOX_CALL, call.type, "completed", digest=digest,
                                result=_result_json(result), meta=done if journal_start else {**meta, **done},
                                defer=True)
            self.state.calls[index] = (op_id, result)
        await self._after_call(index + 1)
        return result

    async def shell(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                    env: Mapping[str, str] | None = None, operation_id: str | None = None,
                    on_replay: str = journal.ON_REPLAY_RERUN) -> ToolResult:
        """Run ``command``; ``on_replay``: see :meth:`call`."""
        args: dict[str, Any] = {"command": command}
        if timeout is not None:
            args["timeout"] = timeout
        if cwd is not None:
            args["cwd"] = cwd
        if env:
            args["env"] = dict(env)
        return await self.call(ToolCall(operation_id=operation_id or self.operation_id(self._next_index), type="shell", args=args),
                               on_replay=on_replay)

    async def write_file(self, path: str, contents: str, *, operation_id: str | None = None,
                         on_replay: str = journal.ON_REPLAY_RERUN) -> ToolResult:
        return await self.call(
            ToolCall(operation_id=operation_id or self.operation_id(self._next_index), type="write_file",
                     args={"path": path, "contents": contents}),
            on_replay=on_replay,
        )

    async def read_file(self, path: str, *, operation_id: str | None = None,
                        on_replay: str = journal.ON_REPLAY_RERUN) -> ToolResult:
        return await self.call(
            ToolCall(operation_id=operation_id or self.operation_id(self._next_index), type="read_file", args={"path": path}),
            on_replay=on_replay,
        )

    def result(self) -> dict[str, Any]:
        calls = [self.state.calls[i] for i in sorted(self.state.calls)]
        return {
            "sandboxId": self.state.newest,
            "provider": self.provider.name,
            "toolResults": [
                {"operationId": op[len(self.sid) + 1 :], **_result_json(res)}
                for op, res in calls
            ],
            "latestSnapshot": self.state.retained,
            "recoveryCount": self.state.recoveries,
        }

    # ------------------------------------------------------------------ context manager

    async def __aenter__(self) -> SandboxSession:
        self._validate()
        if self.state.finalized:
            return self
        rec = self.rt.lookup(journal.provision_id(self.sid))
        if rec is None or rec.status != "completed":
            await self._provision(rec)
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

    def _validate(self) -> None:
        for missing in unmet(self.provider.capabilities(), inject_loss_after=self.inject_loss_after,
                             suspend_between_calls=self.suspend_between_calls, snapshot_every=self.snapshot_every,
                             lease_seconds=self.lease_seconds):
            if missing.capability is not None:
                raise UnsupportedCapability(self.provider.name, missing.capability)
            raise ConfigurationError(
                f"Sandbox {self.sid!r}: lease of {self.lease_seconds} s exceeds provider "
                f"[{self.provider.name}]'s maximum of {missing.maximum} s"
            )
        seen: dict[str, int] = {}
        for i, given in enumerate(self._operation_ids):
            if given is None:
                continue
            if reserved_operation_id(given):
                raise ValueError(
                    f"Sandbox {self.sid!r}: operation id {given!r} (call {i}) is reserved for the session's own "
                    f"records ({', '.join(sorted(journal.RESERVED_HEADS))}); choose another id"
                )
            if given in seen:
                raise ValueError(
                    f"Sandbox {self.sid!r}: operation id {given!r} is given to calls {seen[given]} and {i}; "
                    f"operation ids must be unique (rejected before provisioning)"
                )
            seen[given] = i
        if self.state.provider is not None and self.state.provider != self.provider.name:
            raise ConfigurationError(
                f"Sandbox {self.sid!r} of run {self.rt.run_id!r} was provisioned with provider "
                f"[{self.state.provider}]; a run keeps its provider for its whole life (asked for [{self.provider.name}])"
            )

    # ------------------------------------------------------------------ journal helper

    async def _journal(self, op_id: str, kind: OpKind, name: str, status: str, *, digest: str | None = None,
                       result: Any = None, meta: dict[str, Any] | None = None, error: ErrorInfo | None = None,
                       check_cancel: bool = False, defer: bool = False) -> None:
        prev = self.rt.lookup(op_id)
        attempt = prev.attempt if prev is not None else 1
        record = OperationRecord(op_id, kind.value, name, status, attempt, digest, result, error=error, meta=meta,
                                 epoch=self.rt.epoch)
        if defer:
            self.rt.defer_completion(record)
        else:
            await self.rt.write(record, check_cancel=check_cancel)

    # ------------------------------------------------------------------ provider calls with retries

    async def _transient(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        delay = FIRST_RETRY_DELAY
        attempt = 1
        while True:
            try:
                return await fn()
            except (SandboxGone, UnsupportedCapability, ConfigurationError):
                raise
            except RateLimited as exc:
                # The provider asks us to slow down: the request was not processed and nothing is wrong
                # with it, so the run waits (as long as it takes; a cancel still stops it) and no
                # attempt is spent. The provider has already honoured Retry-After for its own retries.
                wait = min(exc.retry_after if exc.retry_after is not None else delay, MAX_RATE_LIMIT_WAIT)
                log.info("sandbox %s: %s rate limited by provider %s; slowing down, retrying in %.1fs",
                         self.sid, what, self.provider.name, wait)
                await asyncio.sleep(wait)
                delay = min(delay * 2, MAX_RETRY_DELAY)
                continue
            except ProvisionError as exc:
                if not exc.retryable or attempt == TRANSIENT_ATTEMPTS:
                    raise
            except ProviderError:
                if attempt == TRANSIENT_ATTEMPTS:
                    raise
            log.info("sandbox %s: %s failed transiently (attempt %d); retrying in %.1fs", self.sid, what, attempt, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)
            attempt += 1

    async def _with_recovery(self, fn: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                return await self._transient("operation", fn)
            except SandboxGone as gone:
                await self._recover(str(gone))

    async def _execute(self, call: ToolCall) -> ToolResult:
        handle = await self._live_handle()
        if self.suspend_between_calls and self._suspended:
            handle = await self.provider.resume(handle)
            self._suspended = False
        result = await self.provider.execute(handle, call)
        if self.suspend_between_calls:
            await self.provider.suspend(handle)
            self._suspended = True
        return result

    async def _live_handle(self) -> SandboxHandle:
        """The sandbox to use now: the journal's, or one restored after hibernation."""
        handle = self.state.handle
        if handle is None:
            await self._restore(reason="resume")
            handle = self.state.handle
            assert handle is not None
        elif handle.lease_expires_at is not None and handle.lease_expires_at - time.time() < self.lease_seconds / 2:
            handle = await self.provider.renew_lease(handle, self.lease_seconds)
            self.state.handle = handle
        return handle

    # ------------------------------------------------------------------ lifecycle

    async def _provision(self, prev: OperationRecord | None) -> None:
        op_id = journal.provision_id(self.sid)
        if prev is not None:
            await self._reap_unrecorded()
        self.rt.enter(op_id, OpKind.SANDBOX_PROVISION.value, self.provider.name, None)
        meta = {"provider": self.provider.name, "options": self._options()}
        await self._journal(op_id, OpKind.SANDBOX_PROVISION, self.provider.name, "started", meta=meta, check_cancel=True)
        if self.attach is not None:
            handle = await self._attached_handle(self.attach)
        else:
            spec = self._spec_for(op_id)
            handle = await self._transient("provision", lambda: self.provider.provision(spec, lease_seconds=self.lease_seconds))
            faults.reach(f"provisioned:{op_id}")  # made, not yet journaled: the crash window orphan sweeps close
        await self._journal(op_id, OpKind.SANDBOX_PROVISION, self.provider.name, "completed", result=_handle_json(handle), meta=meta)
        self.state.handle, self.state.newest = handle, handle.id
        self.state.provider = self.provider.name

    async def _attached_handle(self, name: str) -> SandboxHandle:
        """The live sandbox of Sandbox resource ``name`` (``SandboxServices.attached`` finds it)."""
        find = SandboxServices.of(self.rt).attached
        if find is None:
            raise ConfigurationError(
                f"Sandbox {self.sid!r}: sandboxRef {name!r} names a Sandbox resource, which only the operator can "
                f"attach; run this Workflow in a cluster, or give it spec.sandbox"
            )
        handle: SandboxHandle = await find(self.rt.run_id, name)
        return handle

    def _attached_name(self) -> str | None:
        """The Sandbox resource this session runs in (None: its own sandbox), as given or as journaled."""
        return self.attach or self.state.options.get("attach")

    def _attached_id(self) -> str | None:
        """The id of the attached Sandbox resource's sandbox (None for a session's own sandbox)."""
        if not self._attached_name():
            return None
        rec = self.rt.lookup(journal.provision_id(self.sid))
        if rec is not None and rec.status == "completed" and isinstance(rec.result, dict):
            return rec.result.get("id")
        return None

    def _spec_for(self, op_id: str) -> SandboxSpec:
        """The spec for one provision/restore: its operation id lets a provider with an idempotent create
        answer the engine's retry of it with the same sandbox."""
        return self.spec.model_copy(update={"operation_id": f"{self.rt.run_id}/{op_id}"})

    def _options(self) -> dict[str, Any]:
        # Never the env: it may hold secrets.
        return {
            "template": self.spec.template,
            "leaseSeconds": self.lease_seconds,
            "snapshotEvery": self.snapshot_every,
            "retainLatestSnapshot": self.retain_latest_snapshot,
            "injectLossAfter": self.inject_loss_after,
            "attach": self.attach,
        }

    async def _reap_unrecorded(self) -> None:
        """A crash between the provider creating a sandbox and the journal recording it would leak it:
        find such sandboxes by their labels and destroy them before making a new one. (A Sandbox resource's
        sandbox, attached, is never this session's to destroy.)"""
        if self._attached_name():
            return
        if not self.provider.capabilities().supports(Capability.LEASE_RECONCILIATION):
            return
        try:
            handles = await self.provider.list_sandboxes(self.spec.owner or "")
        except ProviderError:
            return
        known = {h.id for h in self.state.pending_handles} | ({self.state.handle.id} if self.state.handle else set())
        for h in handles:
            labels = h.metadata.get("labels") or {}
            if labels.get("durable-sandbox.dev/run-id") == self.rt.run_id and labels.get("durable-sandbox.dev/session") == self.sid and h.id not in known:
                try:
                    await self._retry_cleanup(f"destroy unrecorded sandbox {h.id}", functools.partial(self.provider.destroy, h))
                except CleanupFailed as exc:  # not this run's failure: the orphan sweep removes it later
                    log.warning("run %s, session %s: %s", self.rt.run_id, self.sid, exc)

    async def _after_call(self, count: int) -> None:
        # While replaying calls completed further on (a re-opened session), no sandbox holds exactly
        # ``count`` calls: only recorded checkpoints apply, nothing new is taken or injected.
        current = count >= self.state.completed
        if self.snapshot_every and count % self.snapshot_every == 0:
            await self._checkpoint(count, fresh=current)
        if self.inject_loss_after is not None and count == self.inject_loss_after and current:
            await self._inject_loss(count)
        if current and self.state.handle is None and self._interrupted_restore():
            # A recovery that waited for an answer (ask) or was cut short by a crash: finish it now, not at the
            # next call (there may be none: a loss after the last call still rebuilds the workspace).
            try:
                await self._restore(reason=journal.REASON_RECOVERY)
            except SandboxGone as again:
                await self._recover(str(again))

    def _interrupted_restore(self) -> bool:
        rec = self.rt.lookup(journal.restore_id(self.sid, self.state.restores + 1))
        return rec is not None and rec.status == "started"

    async def _checkpoint(self, count: int, *, fresh: bool = True) -> None:
        """Snapshot at ``count`` calls, record it, then delete the checkpoint it supersedes."""
        # A re-opened session's snapshots get ids of their own: the failed attempt's were deleted.
        op_id = journal.snapshot_id(self.sid, count, self.generation)
        rec = self.rt.lookup(op_id)
        if not fresh and (rec is None or rec.status != "completed"):
            return
        if rec is None or rec.status != "completed":
            provider_op = "dsv1s_" + hashlib.sha256(f"{self.rt.run_id}\0{op_id}".encode()).hexdigest()[:40]

            async def take() -> str:
                return await self.provider.snapshot(await self._live_handle(), operation_id=provider_op)

            await self._journal(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "started", meta={"count": count, "operationId": provider_op})
            snapshot_id = await self._with_recovery(take)
            faults.reach(f"snapshot-taken:{op_id}")
            await self._journal(op_id, OpKind.SANDBOX_SNAPSHOT, "snapshot", "completed", result={"snapshotId": snapshot_id},
                                meta={"count": count, "operationId": provider_op})
            faults.reach(f"snapshot-recorded:{op_id}")
            self.state.checkpoints.append(Checkpoint(count, snapshot_id, op_id))
        for old in [c for c in self.state.checkpoints if c.count < count]:
            await self._delete_snapshot(old)

    async def _delete_snapshot(self, cp: Checkpoint) -> None:
        op_id = journal.delete_id(cp.op_id)
        meta = {journal.META_SNAPSHOT_ID: cp.snapshot_id}
        await self._journal(op_id, OpKind.SANDBOX_SNAPSHOT_DELETE, "delete", "started", meta=meta)
        await self._retry_cleanup(f"delete snapshot {cp.snapshot_id}", lambda: self.provider.delete_snapshot(cp.snapshot_id))
        await self._journal(op_id, OpKind.SANDBOX_SNAPSHOT_DELETE, "delete", "completed", meta=meta)
        self.state.checkpoints = [c for c in self.state.checkpoints if c.snapshot_id != cp.snapshot_id]

    async def _inject_loss(self, count: int) -> None:
        op_id = journal.inject_loss_id(self.sid, count)
        rec = self.rt.lookup(op_id)
        if rec is not None and rec.status == "completed":
            return
        handle = self.state.handle
        await self._journal(op_id, OpKind.SANDBOX_INJECT_LOSS, "inject_loss", "started", meta={"count": count})
        if handle is not None:
            await self.provider.inject_loss(handle)
        await self._journal(op_id, OpKind.SANDBOX_INJECT_LOSS, "inject_loss", "completed",
                            meta={journal.META_COUNT: count, journal.META_SANDBOX_ID: handle.id if handle else None})
        await self._recover("loss injected")

    async def _recover(self, why: str) -> None:
        if self._attached_id() is not None:
            raise DurableError(
                f"Sandbox {self.sid!r}: the sandbox of Sandbox resource {self._attached_name()!r} "
                f"was lost ({why}); its controller re-creates it from its newest snapshot. Run the Workflow again "
                f"(or give it spec.retry) to continue in the re-created sandbox."
            )
        while True:
            if self.state.recovery_attempts >= MAX_RECOVERIES:
                raise RecoveryBudgetExhausted(self.sid, MAX_RECOVERIES)
            self.rt.emit("sandbox.lost", session=self.sid, reason=why)
            lost = self.state.handle
            if lost is not None:
                await self._destroy(lost, reason="lost")
            try:
                await self._restore(reason="recovery")
            except SandboxGone as again:  # the replacement was lost too while being rebuilt: another recovery
                why = str(again)
                continue
            break

    async def _restore(self, *, reason: str) -> None:
        """Make a replacement sandbox from the newest checkpoint (or fresh), replay the calls since it."""
        number = self.state.restores + 1
        op_id = journal.restore_id(self.sid, number)
        prev = self.rt.lookup(op_id)
        if prev is not None and prev.status == "started":  # finishing a restore a crash interrupted: same reason
            reason = (prev.meta or {}).get(journal.META_REASON, reason)
        cp = self.state.latest
        meta: dict[str, Any] = {journal.META_REASON: reason, journal.META_SNAPSHOT_ID: cp.snapshot_id if cp else None,
                                "fromCount": cp.count if cp else 0}
        if prev is not None and prev.status == "started":
            for h in self.state.pending_handles:  # a half-finished restore from before a crash
                await self._destroy(h, reason="abandoned")
            # The crash (or a lost lease: another replica takes the run over) may have come between the
            # provider making the replacement and the journal naming it.
            await self._reap_unrecorded()
        await self._journal(op_id, OpKind.SANDBOX_RESTORE, cp.snapshot_id if cp else "fresh", "started", meta=meta)
        try:
            # Before anything is made: a restore that waits for answers holds no sandbox (Suspend passes through).
            plan, asked = await self._replay_plan(cp.count if cp else 0)
        except ReplayAnswerInvalid as exc:
            await self._restore_failed(op_id, number, cp, meta, exc)
            raise
        spec = self._spec_for(op_id)
        if cp is not None:
            handle = await self._transient("restore", lambda: self.provider.restore(cp.snapshot_id, spec, lease_seconds=self.lease_seconds))
        else:
            handle = await self._transient("provision", lambda: self.provider.provision(spec, lease_seconds=self.lease_seconds))
        faults.reach(f"provisioned:{op_id}")  # made, not yet journaled: reaped when the restore is finished
        # Record the new sandbox before replaying into it, so a crash mid-replay cannot leak it.
        await self._journal(op_id, OpKind.SANDBOX_RESTORE, cp.snapshot_id if cp else "fresh", "started", meta={**meta, "handle": _handle_json(handle)})
        self.state.pending_handles.append(handle)
        replayed: list[str] = []
        skipped: list[str] = []
        try:
            for index, op, recorded, rerun in plan:
                if not rerun:  # skip: not executed again; its journaled result stands
                    skipped.append(op)
                    continue
                call = self._recorded_call(op, index)
                # Transient provider errors are retried here too; a loss escapes to _recover (try again).
                outcome = (await self._transient("replay", functools.partial(self.provider.execute, handle, call))).capped()
                if outcome.outcome != recorded.outcome:
                    raise ReconstructionError(op[len(self.sid) + 1 :], recorded, outcome)
                replayed.append(op)
        except BaseException as exc:
            # A replacement that is not faithful (or could not be finished) is destroyed, never adopted.
            await self._destroy(handle, reason="rejected")
            await self._restore_failed(op_id, number, cp, meta, exc)
            raise
        await self._journal(op_id, OpKind.SANDBOX_RESTORE, cp.snapshot_id if cp else "fresh", "completed",
                            result=_handle_json(handle),
                            meta={**meta, journal.META_REPLAYED: replayed, journal.META_SKIPPED: skipped,
                                  journal.META_ASKED: asked})
        self.state.handle, self.state.newest = handle, handle.id
        self.state.restores = number
        if reason == "recovery":
            self.state.recoveries += 1
            self.state.recovery_attempts += 1

    async def _restore_failed(self, op_id: str, number: int, cp: Checkpoint | None, meta: dict[str, Any],
                              exc: BaseException) -> None:
        """Journal restore ``number`` as failed (it counts against the recovery budget when it was one)."""
        await self._journal(op_id, OpKind.SANDBOX_RESTORE, cp.snapshot_id if cp else "fresh", "failed", meta=meta,
                            error=ErrorInfo.from_exception(exc, retryable=False))
        self.state.restores = number
        if meta.get(journal.META_REASON) == journal.REASON_RECOVERY:
            self.state.recovery_attempts += 1

    async def _replay_plan(self, first: int) -> tuple[list[tuple[int, str, ToolResult, bool]], dict[str, str]]:
        """(index, op id, recorded result, rerun?) of every completed call from ``first`` on, and the answers
        of the asked ones. Every ask not answered yet is journaled as a pending callback, all at once, then
        the run waits (``Suspend``) on all of them."""
        plan: list[tuple[int, str, ToolResult, bool]] = []
        asked: dict[str, str] = {}
        waiting: list[str] = []
        for index in range(first, self.state.completed):
            op, recorded = self.state.calls[index]
            policy = self.state.policies.get(op, journal.ON_REPLAY_RERUN)
            if policy == journal.ON_REPLAY_ASK:
                answer = await self._answer(op, index)
                if answer is None:
                    waiting.append(journal.ask_id(op))
                    continue
                asked[op] = answer
                policy = answer
            plan.append((index, op, recorded, policy == journal.ON_REPLAY_RERUN))
        if waiting:
            log.info("sandbox %s: replay waits for %s (answer rerun or skip)", self.sid, ", ".join(waiting))
            raise Suspend(waiting)
        return plan, asked

    async def _answer(self, op: str, index: int) -> str | None:
        """The answer to the replay callback of call ``op``: journaled, signalled (then journaled), or None
        (the callback is journaled as pending). Only a signal (``dsb signal``, the Workflow's spec.signals)
        answers it."""
        ask = journal.ask_id(op)
        if ask in self._answers:
            return self._answers[ask]
        rt = self.rt
        rec = rt.lookup(ask)
        if rec is not None and rec.kind != OpKind.CALLBACK.value:
            raise DurableError(f"Sandbox {self.sid!r}: {ask!r} is taken by a {rec.kind} operation; rename that operation")
        started = rt.first.get(op)
        recorded = ((started.meta or {}).get(journal.META_CALL) if started is not None else None) or {}
        payload = {"call": op, "index": index, "type": recorded.get("type"),
                   "target": journal.call_target(started) if started is not None else None,
                   "answers": list(journal.ANSWERS),
                   "why": "the sandbox was lost and is being rebuilt; answer rerun to execute this call again, "
                          "or skip to keep its journaled result without executing it"}
        digest = value_digest(payload)
        if rec is not None and rec.status == "completed":
            value = rec.result
        else:
            if ask not in rt.signals:  # a signal may have come while this execution ran
                rt.signals.update(await rt.store.get_signals(rt.run_id))
            if ask not in rt.signals:
                if rec is None or rec.status != "started":
                    await rt.write(OperationRecord(ask, OpKind.CALLBACK.value, ask, "started", 1, digest,
                                                   meta={"payload": payload, "deadline": None}, epoch=rt.epoch))
                    faults.reach(f"asked:{ask}")
                return None
            value = rt.signals[ask]
            await rt.write(OperationRecord(ask, OpKind.CALLBACK.value, ask, "completed", 1, digest, value, epoch=rt.epoch))
        rt.reached(ask)
        if value not in journal.ANSWERS:
            raise ReplayAnswerInvalid(ask, value)
        self._answers[ask] = value
        return str(value)

    def _recorded_call(self, op_id: str, index: int) -> ToolCall:
        # The workflow re-issues its calls in order before any later one can need a recovery, so every
        # call to replay was seen in this process, env values included; the journal is the fallback.
        if op_id in self._calls:
            return self._calls[op_id]
        rec = self.rt.first.get(op_id)
        args = (rec.meta or {}).get("call") if rec else None
        if args is None:
            raise DurableError(f"Sandbox {self.sid!r}: call {op_id} has no recorded arguments to replay")
        if args["args"].get("env"):
            raise DurableError(
                f"Sandbox {self.sid!r}: call {op_id} set env values, which the journal does not keep; it can only "
                f"be replayed after the workflow issues it again"
            )
        return ToolCall(operation_id=op_id[len(self.sid) + 1 :], type=args["type"], args=args["args"])

    async def _destroy(self, handle: SandboxHandle, *, reason: str) -> None:
        op_id = journal.destroy_id(self.sid, handle.id)
        rec = self.rt.lookup(op_id)
        if rec is not None and rec.status == "completed":
            return
        meta: dict[str, Any] = {journal.META_SANDBOX_ID: handle.id, journal.META_REASON: reason}
        if handle.id == self._attached_id():
            # A Sandbox resource's sandbox is let go, not destroyed: it outlives the run.
            meta[journal.META_DETACHED] = True
            await self._journal(op_id, OpKind.SANDBOX_DESTROY, "detach", "completed", meta=meta)
            if self.state.handle is not None and self.state.handle.id == handle.id:
                self.state.handle = None
            return
        await self._journal(op_id, OpKind.SANDBOX_DESTROY, "destroy", "started", meta=meta)
        await self._retry_cleanup(f"destroy sandbox {handle.id}", lambda: self.provider.destroy(handle))
        await self._journal(op_id, OpKind.SANDBOX_DESTROY, "destroy", "completed", meta=meta)
        if self.state.handle is not None and self.state.handle.id == handle.id:
            self.state.handle = None
        self.state.pending_handles = [h for h in self.state.pending_handles if h.id != handle.id]

    async def _retry_cleanup(self, what: str, fn: Callable[[], Awaitable[None]]) -> None:
        delay = FIRST_RETRY_DELAY
        for attempt in range(1, CLEANUP_ATTEMPTS + 1):
            try:
                await fn()
                return
            except SandboxGone:
                return
            except ProviderError as exc:
                if attempt == CLEANUP_ATTEMPTS or not exc.retryable:
                    raise CleanupFailed(f"Could not {what} after {attempt} attempts: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)

    # ------------------------------------------------------------------ hibernation and finalization

    async def hibernate(self) -> bool:
        """Checkpoint and destroy the sandbox while the run waits; it is restored when the run goes on."""
        caps = self.provider.capabilities()
        if self.state.handle is None or self.state.finalized or self._attached_id() is not None:
            return False  # an attached sandbox is suspended by its Sandbox resource, not by the run
        if not (caps.supports(Capability.SNAPSHOT) and caps.supports(Capability.RESTORE)):
            return False
        count = self.state.completed
        latest = self.state.latest
        if latest is None or latest.count != count:
            await self._checkpoint(count)
        handle = self.state.handle
        if handle is not None:
            await self._destroy(handle, reason="hibernate")
        self.rt.emit("sandbox.hibernated", session=self.sid, count=count)
        return True

    async def finalize(self, *, succeeded: bool) -> None:
        if self.state.finalized:
            return
        keep = self.state.latest if (succeeded and self.retain_latest_snapshot) else None
        for h in list(self.state.pending_handles):
            await self._destroy(h, reason="finalize")
        if self.state.handle is not None:
            await self._destroy(self.state.handle, reason="finalize")
        # A create whose answer never reached the journal (an executor that lost its lease or died while a
        # provision or restore was in flight, then another took the run over) made a sandbox only its labels
        # name: the run's end is the last moment this session can find it before the orphan sweep.
        await self._reap_unrecorded()
        for cp in list(self.state.checkpoints):
            if keep is None or cp.snapshot_id != keep.snapshot_id:
                await self._delete_snapshot(cp)
        await self.rt.write(
            OperationRecord(
                journal.finalize_id(self.sid, self.generation),
                OpKind.SANDBOX_DESTROY.value, "finalize", "completed", 1, None, None,
                meta={journal.META_FINALIZED: True, journal.META_RETAINED: keep.snapshot_id if keep else None,
                      journal.META_SUCCEEDED: succeeded},
                epoch=self.rt.epoch,
            )
        )
        self.state.finalized = True
        self.state.retained = keep.snapshot_id if keep else None


# ------------------------------------------------------------------------------------------ factory


ProviderSource = Mapping[str, SandboxProvider] | Callable[[str], SandboxProvider] | None


class SessionFactory:
    """What ``durable_sandbox.Engine`` plugs into the bare engine as ``ctx.sandbox``."""

    def __init__(self, providers: ProviderSource = None) -> None:
        self._source = providers
        self._cache: dict[str, SandboxProvider] = {}

    def providers(self, name: str) -> SandboxProvider:
        if name in self._cache:
            return self._cache[name]
        if isinstance(self._source, Mapping):
            if name not in self._source:
                known = ", ".join(sorted(self._source)) or "none"
                raise ConfigurationError(f"Unknown sandbox provider [{name}]; this engine has: {known}")
            provider = self._source[name]
        elif callable(self._source):
            provider = self._source(name)
        else:
            from durable_sandbox.providers.registry import create_provider

            provider = create_provider(name)
        if provider.name != name:
            raise ConfigurationError(f"Provider registered as [{name}] calls itself [{provider.name}]; refusing it")
        self._cache[name] = provider
        return provider

    def __call__(self, ctx: Context, id: str, *, provider: str = "local", **options: Any) -> SandboxSession:
        rt = ctx.operations
        return SandboxSession(rt, ctx.scope + id, self.providers(provider), **options)

    async def _cleanup_sessions(self, rt: RunRuntime, action: str) -> None:
        rows = rt.known_rows()
        for sid in sessions_in(rows):
            state = SessionState.derive(sid, rows)
            state.reopen_for(rt.epoch)
            if state.finalized or state.provider is None:
                continue
            session = SandboxSession(rt, sid, self.providers(state.provider), lease_seconds=int(state.options.get("leaseSeconds", 3600)))
            if action == "hibernate":
                await session.hibernate()
            else:
                await session.finalize(succeeded=False)

    async def after_run(self, rt: RunRuntime, status: RunStatus) -> None:
        """A retained snapshot passes to the caller only if the *run* succeeds: when it fails or is
        cancelled after its sandbox block ended, the snapshot is deleted like any other."""
        if getattr(status, "value", status) == "succeeded":
            return
        rows = rt.known_rows()
        for sid in sessions_in(rows):
            state = SessionState.derive(sid, rows)
            kept = [c for c in state.checkpoints if state.finalized and c.snapshot_id == state.retained]
            if kept and state.provider is not None:
                session = SandboxSession(rt, sid, self.providers(state.provider))
                await session._delete_snapshot(kept[0])

    async def cancel_cleanup(self, executor: RunExecutor, run: RunRecord, lease: Lease) -> None:
        """Finalize every sandbox session of a run that is cancelled while not executing."""
        rt = await executor.open_runtime(run, lease)
        await self._cleanup_sessions(rt, "finalize")

    async def hibernate_run(self, executor: RunExecutor, run: RunRecord, lease: Lease) -> None:
        """Hibernate every live sandbox of a waiting run (snapshot, then destroy)."""
        rt = await executor.open_runtime(run, lease)
        await self._cleanup_sessions(rt, "hibernate")

    async def aclose(self) -> None:
        for provider in self._cache.values():
            await provider.aclose()
