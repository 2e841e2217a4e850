"""A Sandbox fork (``spec.from``) starts from its source's snapshot, not from a replay of every call.

The fork's seed (``fork_seed.py``) records the source's newest snapshot at or before the fork point ``N`` as a
*borrowed* checkpoint of the fork's session (the same record a run fork starts with: ``sandboxes/fork_journal.py``).
Before the fork's first call runs, under its journal's lease:

1. :func:`own_fork_point`: when the provider copies snapshots (``Capability.SNAPSHOT_COPY``) and restores them, the
   borrowed snapshot is copied into one of the fork's own (``sandboxes/fork.py``'s ``ForkSession.own_borrowed``,
   the code ``Workflow.spec.forkOf`` runs: ``started`` journaled before the copy under a stable provider operation
   id, ``completed`` with the copy's id after), and the borrowed one is let go (journaled only: its owner deletes
   it). Without the capability, or if the source deleted its snapshot meanwhile, it is only let go: the fork
   replays every call, as before.
2. :func:`restores_instead`: the fork's live sandbox, provisioned fresh by its controller before any of this, holds
   no call; when the fork owns a snapshot holding some, the fresh sandbox is given back (destroyed) and the
   controller replaces it from the newest snapshot of the session (``kube/sandbox/operations.py``), which is the
   copy: only the calls after it, up to ``N``, are then replayed, with the outcome check (``rebuild.py``).

Ownership (each snapshot deleted exactly once, by its one owner): the source keeps and deletes its own snapshot;
the copy is a checkpoint of the fork's session like any other, deleted when a newer one supersedes it, by a rewind
that makes it stale, or with the fork (its finalizer: ``kube/sandbox/checkpoints.py``, which also finishes a copy
interrupted between the provider's copy and its record, under the same operation id, so that it is deleted too).
A borrowed checkpoint is never restored nor deleted by the fork's controller.
"""

from __future__ import annotations

import logging

from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.kube.sandbox.view import CALLS_SESSION
from durable_sandbox.providers.contract import Capability, ProvisionError, SandboxProvider
from durable_sandbox.sandboxes.fork import ForkSession
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.sessions.fork_seed import seeded

__all__ = ["own_fork_point", "restores_instead"]

log = logging.getLogger("durable_sandbox.sessions")


def _restorable(provider: SandboxProvider) -> bool:
    caps = provider.capabilities()
    return caps.supports(Capability.SNAPSHOT_COPY) and caps.supports(Capability.RESTORE)


async def own_fork_point(rt: RunRuntime, provider: SandboxProvider, *, sandbox: str, owner: str, where: str) -> None:
    """Step 1 of the module's docstring; nothing to do once no borrowed checkpoint is left (every later call)."""
    state = SessionState.derive(CALLS_SESSION, rt.rows)
    if not any(c.borrowed for c in state.checkpoints):
        return
    session = ForkSession(rt, CALLS_SESSION, provider, attach=sandbox, owner=owner, next_index=state.next_index)
    if _restorable(provider):
        try:
            await session.own_borrowed()
        except ProvisionError as gone:  # its owner deleted it meanwhile: the fork replays every call instead
            if gone.retryable:
                raise  # a passing failure: the next call copies again, under the same operation id
            log.warning("%s: the source's snapshot could not be copied (%s); the fork replays its calls instead",
                        where, gone)
    for borrowed in [c for c in session.state.checkpoints if c.borrowed]:
        await session.checkpointer.delete(borrowed)  # journaled only: its owner deletes it


def restores_instead(rt: RunRuntime, provider: SandboxProvider, has: int, before: int) -> int | None:
    """Step 2: the calls held by the fork's own snapshot that a sandbox holding ``has`` calls (fresh: 0) should be
    replaced from rather than replay up to ``before``; None: replay (not a fork's fresh sandbox, or no snapshot)."""
    if has != 0 or not seeded(rt) or not _restorable(provider):
        return None
    own = [c.count for c in SessionState.derive(CALLS_SESSION, rt.rows).checkpoints if not c.borrowed]
    usable = [count for count in own if 0 < count <= before]
    return usable[-1] if usable else None
