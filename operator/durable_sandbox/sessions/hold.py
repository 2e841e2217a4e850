"""A Sandbox's session kept open while calls keep coming: its call journal's lease, the journal read once, and
(once a call needs it) the Sandbox's holder and live sandbox, all taken by the first call of a burst and let go
after an idle gap.

Why: taking the holder (a compare-and-swap of the Sandbox's record and a status patch), claiming the lease and
reading the journal for every call cost ~10 API writes and several reads per call. Kept open, a call costs its one
journal commit; the lease is renewed in the background (every third of its time to live), and the rest is paid
once per burst.

What stays as it was:
- **Fencing.** Every commit carries the lease's fence; a replica whose lease lapsed and was claimed by another
  can no longer commit. The lease is kept by the engine's keeper (engine/lease_keeper.py): a renewal that fails
  for a moment (``StoreUnavailable``) is retried until the safety point, a third of the TTL before the lease could
  expire; a renewal that finds the lease lost, or none that succeeded by then, cancels the call in flight here and
  drops the hold, never releasing what it no longer owns (the lease, nor the Sandbox's session claim: the replica holding
  the lease now holds that claim too, and releases it). A call starts under a hold only while the lease was
  renewed within two thirds of its time to live (``fresh``), else after renewing it then: a replica whose renewals
  fail (the store away from it) starts no call before it knows the lease is still its own.
- **The journal read is current.** While this replica holds the lease no other replica can write the journal,
  so the rows kept in memory are the journal; a new hold reads it afresh.
- **The holder rule.** A Workflow that comes while a session holds the Sandbox waits (``WaitingForSandbox``)
  until the hold is let go: after ``idle_seconds`` without a call, or when the hold is ``max_seconds`` old (it is
  let go after the call in flight and taken again by the next one: a waiting Workflow, a ``spec.suspend`` or the
  Sandbox's deletion get their turn even while calls keep coming, and the holder's ``lastActiveAt`` stays fresh).
- **Failure drops the hold.** A call that fails in any other way than a refusal (the provider, the store, a
  cancel) lets go of everything, so the next call starts afresh (a re-created live sandbox read from the record).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from durable_sandbox.engine.errors import LeaseLost
from durable_sandbox.engine.lease_keeper import LeaseKeeper, PastSafetyPoint, SystemClock
from durable_sandbox.engine.records import Lease, RunRecord
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider
from durable_sandbox.sessions.derived import DerivedJournal

__all__ = ["HoldSettings", "LeftToAnotherReplica", "OpenSession"]

log = logging.getLogger("durable_sandbox.sessions")

Live = AbstractAsyncContextManager[tuple[SandboxHandle, SandboxProvider]]


class LeftToAnotherReplica(Exception):
    """Thrown into the live sandbox's context when a hold whose lease was lost (or cannot be told to be still this
    replica's) is let go: the Sandbox's holder is then not released, since the replica that holds the lease now
    holds it under the same session claim and releases it itself."""


class HoldSettings(BaseModel):
    """How long a Sandbox's session stays open between calls (``dsb operator --session-hold-seconds``)."""

    model_config = ConfigDict(frozen=True)

    idle_seconds: float = Field(default=5.0, ge=0)  # let go after this long with no call (0: after every call)
    max_seconds: float = Field(default=30.0, gt=0)  # let go after the call in flight once the hold is this old


@dataclass(eq=False)
class OpenSession:
    """One Sandbox's open session in this process: its lease, journal runtime and (lazily) live sandbox."""

    lease: Lease
    rt: RunRuntime
    run: RunRecord  # the journal's run: reopened under the lease after a replacement (sessions/journal.py)
    opened: float = field(default_factory=time.monotonic)
    renewed: float = field(default_factory=time.monotonic)  # when the lease was last claimed or renewed
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    lost: bool = False  # the lease was lost: nothing may be released or written by this hold any more
    handle: SandboxHandle | None = None
    provider: SandboxProvider | None = None
    in_flight: asyncio.Task[Any] | None = None
    derived: DerivedJournal = field(default_factory=DerivedJournal)  # what ``rt``'s rows say, folded as they grow
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def fresh(self, ttl: float) -> bool:
        """Whether a call may start under this hold: the lease was renewed within the last two thirds of its time
        to live (renewals come every third), so it is surely still this replica's. A hold whose renewals have been
        failing is let go and the lease claimed again, never trusted to run a call another replica may be running."""
        return not self.closed and time.monotonic() - self.renewed < ttl * 2 / 3

    def due(self, settings: HoldSettings) -> float:
        """When the hold is to be let go (monotonic seconds), if no call comes first."""
        return min(self.last_used + settings.idle_seconds, self.opened + settings.max_seconds)

    async def live(self, take: Callable[[], Live]) -> tuple[SandboxHandle, SandboxProvider]:
        """The live sandbox, taken (the holder) by the first call that needs it and kept until the hold closes."""
        if self.handle is not None and self.provider is not None:
            return self.handle, self.provider
        handle, provider = await self._stack.enter_async_context(take())
        self.handle, self.provider = handle, provider
        return handle, provider

    def start(self, renew: Callable[[Lease], Awaitable[Lease]], ttl: float, settings: HoldSettings,
              close: Callable[[OpenSession], Awaitable[None]]) -> None:
        self._tasks = [asyncio.create_task(self._keep(renew, ttl, close)),
                       asyncio.create_task(self._expire(settings, close))]

    async def refresh(self, renew: Callable[[Lease], Awaitable[Lease]]) -> bool:
        """Renew the lease now (a hold whose background renewals have fallen behind); False when it is lost or
        the store cannot say (then nothing is released: another replica may hold the session)."""
        try:
            self.lease = await renew(self.lease)
        except Exception as exc:
            log.warning("the call journal %s: the lease could not be renewed before a call (%s); letting go of "
                        "the session without releasing what another replica may hold", self.lease.run_id, exc)
            self.lost = True
            return False
        self.renewed = time.monotonic()
        return True

    async def _keep(self, renew: Callable[[Lease], Awaitable[Lease]], ttl: float,
                    close: Callable[[OpenSession], Awaitable[None]]) -> None:
        """Renew the lease in the background (engine/lease_keeper.py's keeper: a renewal that fails for a moment
        is retried until the safety point, a third of the TTL before the lease could expire); when the lease is
        lost, or not renewed by then, abandon the call in flight here and let go of the session."""
        keeper = LeaseKeeper(lambda lease, _ttl: renew(lease), self.lease, ttl, SystemClock())
        delay = keeper.next_renewal()
        while not self.closed:
            await asyncio.sleep(delay)
            try:
                delay = await keeper.renew()
            except LeaseLost as exc:
                # Not renewed in time (PastSafetyPoint: the keeper said why, as a warning) or lost to another.
                (log.warning if isinstance(exc, PastSafetyPoint) else log.error)(
                    "the call journal %s: lease %s; abandoning the call in flight here and letting go of the session",
                    self.lease.run_id, "not renewed in time" if isinstance(exc, PastSafetyPoint) else "lost")
                self.lost = True
                if self.in_flight is not None:
                    self.in_flight.cancel()
                await close(self)
                return
            self.lease = keeper.lease
            if not keeper.failures and not keeper.refused:
                self.renewed = max(self.renewed, keeper.valid_until - keeper.ttl)

    async def _expire(self, settings: HoldSettings, close: Callable[[OpenSession], Awaitable[None]]) -> None:
        while not self.closed:
            await asyncio.sleep(max(self.due(settings) - time.monotonic(), 0.01))
            if time.monotonic() < self.due(settings):
                continue  # a call came meanwhile
            async with self.lock:  # after the call in flight, if any
                if not self.closed and time.monotonic() >= self.due(settings):
                    await close(self)
                    return

    async def shut(self, release: Callable[[Lease], Awaitable[None]]) -> None:
        """Let go of the live sandbox (the holder) and the lease (not when it was lost). Idempotent."""
        if self.closed:
            return
        self.closed = True
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me:
                task.cancel()
        try:
            if self.lost:
                await self._stack.__aexit__(LeftToAnotherReplica, LeftToAnotherReplica(), None)
            else:
                await self._stack.aclose()
        except LeftToAnotherReplica:
            pass
        except Exception as exc:
            log.warning("the call journal %s: letting go of the Sandbox failed (%s); its holder lapses by itself",
                        self.lease.run_id, exc)
        finally:
            self.handle = self.provider = None
        if not self.lost:
            with contextlib.suppress(Exception):
                await release(self.lease)
