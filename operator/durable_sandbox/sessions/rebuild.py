"""Bringing the Sandbox's live sandbox to the state a session call expects: every earlier completed session call in
it, once, in order.

The Sandbox's controller owns its live sandbox: after a loss it restores the newest snapshot (a suspend's, or one
the session calls took every ``spec.snapshotEveryNCalls``), after an idle suspend it resumes from the suspend's
snapshot, and it records where each sandbox and snapshot came from (the record's lineage). Before a call runs,
this module decides how many session calls the live sandbox holds:

- the journal knows the sandbox (a call completed in it, or it was rebuilt): what the journal says;
- else its lineage leads to a sandbox or snapshot the journal knows (a session snapshot holds its count, a
  suspend's snapshot what the sandbox it was taken of held), or to a fresh provision (none);
- else (a sandbox older than lineage records): all of them.

The calls it lacks are replayed into it in order (``rebuild/<sandbox id>``: started before, completed after; the
same outcome required, nonzero exits included; a call journaled with ``onReplay: skip`` is not executed again).
A sandbox whose state is unknown is never used: one the journal knows while a call of the session was started
and never answered (the operator died while it ran: it may have run, partly or fully), or whose rebuild was cut
short, is destroyed, and the call waits for the controller's replacement (its loss check, within half of
``spec.leaseSeconds``), which is then rebuilt from a known state. So the workspace holds every completed call
exactly once; an effect of an interrupted call outside the sandbox may happen twice (at least once).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractAsyncContextManager
from typing import Any, NoReturn, Protocol

from durable_sandbox.engine.errors import DurableError
from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.kube.sandbox.view import CALLS_SESSION
from durable_sandbox.providers.contract import SandboxGone, SandboxHandle, SandboxProvider, ToolCall
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.call_records import result_from
from durable_sandbox.sandboxes.holdings import Holdings, holdings
from durable_sandbox.sandboxes.session import ReconstructionError, SessionState
from durable_sandbox.sessions.fork_restore import restores_instead

__all__ = ["REBUILD", "STALE", "HandedBack", "SandboxAccess", "SandboxUnknown", "held_by", "held_counts", "rebuild"]

log = logging.getLogger("durable_sandbox.sessions")

STALE = -1  # held_by: the sandbox holds calls that were rewound (sandboxes/rewind_journal.py)
REBUILD = journal.REBUILD  # op ids ``rebuild/<sandbox id>``: outside the calls session (an operationId has no "/")


class SandboxAccess(Protocol):
    """A Sandbox's live sandbox for session calls (``kube_gate.py``): taken by a session (hold.py), waited for after a loss."""

    def live(self, ref: Any) -> AbstractAsyncContextManager[tuple[SandboxHandle, SandboxProvider]]: ...

    async def find(self, namespace: str, name: str) -> Any:
        """The Sandbox ``namespace/name`` as the API server has it now (a ``SandboxRef``); CallRefused if none."""
        ...

    async def replaced(self, ref: Any, lost: str) -> SandboxHandle:
        """The live sandbox once it is another than ``lost`` (the controller's replacement)."""
        ...

    async def lineage(self, ref: Any) -> Mapping[str, str]:
        """The record's lineage: sandbox id -> the snapshot it came from ("" fresh), snapshot id -> its sandbox."""
        ...


class SandboxUnknown(Exception):
    """The live sandbox's state is unknown (or it is gone): it must be replaced before a call runs."""

    def __init__(self, sandbox_id: str, why: str) -> None:
        super().__init__(f"sandbox {sandbox_id}: {why}")
        self.sandbox_id = sandbox_id
        self.why = why


class HandedBack(SandboxUnknown):
    """A fork's fresh sandbox given back so that the controller restores the fork's snapshot instead (no loss)."""


def held_counts(rows: Sequence[OperationRecord]) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """From the journal: sandbox id -> the session calls it holds (a call completed in it, a rebuild of it),
    snapshot id -> the calls it holds (the session's snapshots), and the sandboxes whose rebuild was cut short."""
    h = holdings(rows, CALLS_SESSION)
    return h.held, h.snapshots, h.cut


def held_by(sandbox_id: str, held: Mapping[str, int], snapshots: Mapping[str, int],
            lineage: Mapping[str, str], stale: AbstractSet[str] = frozenset()) -> int | None:
    """How many session calls sandbox ``sandbox_id`` holds (None: not known, it predates lineage records;
    :data:`STALE`: it comes from a sandbox or snapshot holding calls that were rewound)."""
    node, seen = sandbox_id, set()
    while node not in seen:
        seen.add(node)
        if node in stale:
            return STALE
        if node in held:
            return held[node]
        if node in snapshots:
            return snapshots[node]
        parent = lineage.get(node)
        if parent is None:
            return None
        if parent == "":
            return 0
        node = parent
    return None


async def rebuild(rt: RunRuntime, handle: SandboxHandle, provider: SandboxProvider,
                  lineage: Callable[[], Awaitable[Mapping[str, str]]], *, before: int, interrupted: bool,
                  where: str, known: tuple[Holdings, SessionState] | None = None) -> None:
    """Bring ``handle`` to hold exactly the session's completed calls before index ``before`` (see the module's
    docstring); :class:`SandboxUnknown` when it cannot be used (then it has been destroyed, if it was there).
    ``lineage`` is read only for a sandbox the journal does not know (the first call into a replacement).
    ``known``: what the journal's rows say (``derived.py``), when folded already (read, never changed)."""
    h = known[0] if known is not None else holdings(rt.rows, CALLS_SESSION)
    held = h.held
    if handle.id in h.cut or handle.id in h.stale or (interrupted and handle.id in held):
        await _unknown(handle, provider, where, "its rebuild was cut short" if handle.id in h.cut else
                       "it holds calls that were rewound" if handle.id in h.stale else
                       "a call was started in it and never answered (the operator stopped while it ran)")
    if handle.id in held and held[handle.id] >= before:
        return  # the sandbox the previous call ran in (the common case: nothing read, nothing written)
    has = held_by(handle.id, held, h.snapshots, await lineage(), h.stale)
    if has is None:  # a sandbox from before lineage was recorded: it has been holding every call (unless rewound)
        has = STALE if h.rewinds else before
    if has == STALE:
        await _unknown(handle, provider, where, "it was made from a sandbox or snapshot holding calls that were "
                       "rewound (or its origin is not known)")
    restores = restores_instead(rt, provider, has, before)
    if restores is not None:  # a fork's fresh sandbox: its own snapshot holding the first calls beats replaying them
        log.info("%s: giving back fresh sandbox %s; the fork's snapshot after %d calls restores it faster than "
                 "replaying them", where, handle.id, restores)
        with contextlib.suppress(SandboxGone):
            await provider.destroy(handle)
        raise HandedBack(handle.id, f"fresh, while the fork's own snapshot holds its first {restores} calls")
    state = known[1] if known is not None else SessionState.derive(CALLS_SESSION, rt.rows)
    plan = [i for i in sorted(state.calls) if has <= i < before]
    op_id = f"{REBUILD}/{handle.id}"
    meta = {"sandbox": handle.id, "from": has, "count": before}
    if plan:  # (none to replay: only what the sandbox holds is recorded, in one write)
        await rt.write(OperationRecord(op_id, OpKind.SANDBOX_RESTORE.value, REBUILD, "started", meta=meta,
                                       epoch=rt.epoch))
    replayed: list[str] = []
    for index in plan:
        op, journaled = state.calls[index]
        recorded = result_from(journaled)
        if state.policies.get(op, journal.ON_REPLAY_RERUN) != journal.ON_REPLAY_RERUN:
            continue  # onReplay: skip: its journaled result stands
        try:
            outcome = (await provider.execute(handle, _recorded_call(rt, op, where))).capped()
        except SandboxGone as gone:
            raise SandboxUnknown(handle.id, f"lost while its calls were replayed ({gone})") from gone
        if outcome.outcome != recorded.outcome:
            raise ReconstructionError(op[len(CALLS_SESSION) + 1:], recorded, outcome)
        replayed.append(op[len(CALLS_SESSION) + 1:])
    await rt.write(OperationRecord(op_id, OpKind.SANDBOX_RESTORE.value, REBUILD, "completed",
                                   result={"replayed": replayed}, meta=meta, epoch=rt.epoch))
    if plan:
        log.info("%s: sandbox %s rebuilt: %d session calls replayed (%s)", where, handle.id, len(replayed),
                 ", ".join(replayed) or "none rerun")


async def _unknown(handle: SandboxHandle, provider: SandboxProvider, where: str, why: str) -> NoReturn:
    """Destroy ``handle``, whose state is unknown or stale, and say so (:class:`SandboxUnknown`)."""
    log.warning("%s: the state of sandbox %s is unknown (%s); destroying it: the controller replaces it from the "
                "newest snapshot and the session's calls are replayed", where, handle.id, why)
    try:
        await provider.destroy(handle)
    except SandboxGone:
        pass
    raise SandboxUnknown(handle.id, why)


def _recorded_call(rt: RunRuntime, op_id: str, where: str) -> ToolCall:
    started = rt.first.get(op_id)
    recorded = (started.meta or {}).get(journal.META_CALL) if started is not None else None
    if not recorded:
        raise DurableError(f"{where}: call {op_id} has no recorded arguments to replay")
    if recorded["args"].get("env"):
        raise DurableError(f"{where}: call {op_id} set env values, which the journal does not keep, so the sandbox "
                           f"cannot be rebuilt after a loss; pass such values in files or the Sandbox's spec.env")
    return ToolCall(operation_id=op_id[len(CALLS_SESSION) + 1:], type=recorded["type"], args=recorded["args"])

