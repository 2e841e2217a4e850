"""What keeps an execution's lease while it runs: renew it every third of its TTL, and notice a cancel that
another process asked for through the store.

When the execution is cancelled here (what Kubernetes' leader election does with ``renewDeadline``):

- **The lease is lost** (``LeaseLost``: the fence moved, another worker has the run): at once.
- **A renewal fails** (``StoreUnavailable``, an API server or PostgreSQL restart; any other error of the
  store): not at once. Nobody else can have the run while the lease this worker holds is still valid, so the
  renewal is retried with a backoff until the *safety point*: the lease's validity by this worker's own
  monotonic clock (``sent + ttl``, ``sent`` read *before* the last renewal that succeeded was sent, so never
  later than the store's own expiry) minus a margin of a third of the TTL (``SAFETY_FRACTION``). A renewal
  that succeeds before then leaves the execution running (no interruption, no snapshot, no hand-back); at the
  safety point the execution is cancelled, a renewal still in flight included (each attempt is bounded by the
  time left). Why a third of the TTL: renewals come every third, so a healthy keeper is a third of the TTL
  past its last success when it renews; the retries get the next third (Kubernetes' defaults: 15 s lease,
  10 s renewDeadline); the last third is the margin, which covers the cancel taking effect (the workflow task
  stops at its next await, the sandbox call in flight is abandoned) and the rate and skew of the clocks that
  others compare the expiry with. A margin of two renewal intervals would leave no time to retry at all. The
  execution never goes on past the point where another worker could validly claim the run: commits are
  fenced, sandbox side effects are not.
- **The keeper wakes late** (this process stalled: its event loop blocked), no renewal having failed: it
  tries once; one that succeeds proves nobody claimed the run (the fence did not move), one that fails ends
  the execution. A stall of the whole process is beyond any keeper (as a GC pause is for leader election).
- **A renewal is refused** (``StoreRefused``): not lost, a definite answer of a store that is there; the
  keeper goes on at the regular interval and the fence decides who may write. This is deliberately *not* the
  safety-point rule, which would not be safe here: the run may be held at a refused commit (engine/refusals.py:
  the hold keeps a completed call's result in memory and offers the commit again until the store takes it),
  and cancelling the execution at the safety point ends that hold, so the call runs again on the next claim:
  the very thing the hold exists to prevent. What the safety point guards against, another executor taking
  the run once the lease lapses, needs a claim, and a claim is a write of the same lease object through the
  same store: a quota, a size limit, a read-only database or RBAC of the executors' own identity refuses it
  as it refused the renewal, and while it lasts nobody can take the run over. If someone's claim does land
  (a refusal aimed at this one writer only), the fence moves and every fenced write of this execution,
  the held commit included, fails ``LeaseLost`` and ends it; a sandbox call already in flight then is not
  fenced: that is the limit of this choice (docs/reliability.md). A failure after refusals is measured from
  the last renewal that *succeeded*, so it ends the execution at once when that is past the safety point.

The execution starts on a lease renewed within the last interval (``LeaseKeeper.start``: renewed first when
reading the run and its journal took longer). The reads of the run looking for a cancel run beside the
renewals, so a read that hangs never holds a renewal back; a failed read is retried at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from durable_sandbox.engine.errors import DurableError, LeaseLost, StoreRefused, StoreUnavailable
from durable_sandbox.engine.records import Lease
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.store import Store

log = logging.getLogger("durable_sandbox.engine")

SAFETY_FRACTION: Final = 1 / 3  # of the TTL: the margin kept between the safety point and the lease's expiry
FIRST_RETRY_FRACTION: Final = 1 / 8  # of the renewal interval: the first retry's delay, doubling up to the interval


class PastSafetyPoint(LeaseLost):
    """The lease was not renewed before the safety point: handled as lost (the execution here is cancelled)."""

    def __init__(self, run_id: str, fence: int) -> None:
        DurableError.__init__(
            self,
            f"The lease on run {run_id!r} (fencing token {fence}) could not be renewed before it could expire: "
            f"this worker stops executing the run, which resumes from its journal when claimed again.",
        )


class LeaseClock(Protocol):
    """The time the renewals are timed by: ``now`` monotonic seconds, ``wall`` the epoch seconds a ``Lease.expires_at`` is in."""

    def now(self) -> float: ...

    def wall(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class SystemClock:
    """The process's clocks (tests pass a fake one)."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class LeaseKeeper:
    """Renews one execution's lease (see the module's docstring for when it cancels the execution)."""

    def __init__(self, renew: Callable[[Lease, float], Awaitable[Lease]], lease: Lease, ttl: float,
                 clock: LeaseClock, *, gave_up: Callable[[Lease], None] | None = None) -> None:
        self.store_renew = renew  # the store's renew (``Store.renew``)
        self.gave_up = gave_up  # told when the keeper gives the lease up past its safety point (a worker's metrics)
        self.lease = lease
        self.ttl = ttl
        self.clock = clock
        self.interval = max(ttl / 3, 0.05)
        # Until the first renewal, the claim's own expiry bounds the lease (never more than one TTL from now).
        held_for = min(ttl, max(0.0, lease.expires_at - clock.wall()))
        self.valid_until = clock.now() + held_for
        self.failures = 0  # renewals failed in a row
        self.refused = False  # the last renewal was refused (StoreRefused)

    async def start(self) -> Lease:
        """Before the execution starts: renew the lease now if more than a renewal interval went by since it was
        claimed (reading the run and its journal took long), so the execution never starts on a lease that may
        be about to expire. Raises what the renewal raised (``LeaseLost``, ``StoreUnavailable``): nothing ran."""
        if self.valid_until - self.clock.now() < self.ttl - self.interval:
            sent = self.clock.now()
            self.lease = await self.store_renew(self.lease, self.ttl)
            self.valid_until = sent + self.ttl
        return self.lease

    def next_renewal(self) -> float:
        """How long until the next regular renewal: a renewal interval after the last one was sent."""
        return max(0.0, self.valid_until - self.ttl + self.interval - self.clock.now())

    @property
    def safety_point(self) -> float:
        """Monotonic time past which this worker must not act under the lease: its validity minus the margin."""
        return self.valid_until - self.ttl * SAFETY_FRACTION

    def retry_delay(self) -> float:
        """How long to wait before the next attempt after ``failures`` failed renewals in a row."""
        delay = min(self.interval, self.interval * FIRST_RETRY_FRACTION * 2 ** (self.failures - 1))
        return max(0.0, min(delay, self.safety_point - self.clock.now()))

    async def renew(self) -> float:
        """One renewal; returns how long to wait before the next (the regular interval, or a retry's backoff
        when it failed). Raises ``LeaseLost`` when the lease is lost, ``PastSafetyPoint`` when the safety point
        came before a renewal succeeded."""
        left = self.safety_point - self.clock.now()
        if left <= 0 and self.failures:
            raise self._past_safety_point("no renewal succeeded in time")
        # A keeper that wakes late without a failure (this process stalled: its event loop was blocked) tries
        # once, for at most an interval (on time, the interval is what is left): a renewal that succeeds proves
        # that nobody claimed the run meanwhile (the fence did not move); one that fails ends the execution.
        sent = self.clock.now()
        bound = asyncio.timeout(None if self.refused else left if self.failures else max(left, self.interval))
        try:
            async with bound:
                self.lease = await self.store_renew(self.lease, self.ttl)
        except TimeoutError as exc:
            if bound.expired():
                raise self._past_safety_point("the renewal did not answer in time") from exc
            return self._failed(exc)
        except StoreUnavailable as exc:  # a LeaseLost by type, but nobody else has the lease: retry
            return self._failed(exc)
        except LeaseLost:
            raise
        except StoreRefused as exc:
            # Refused, not lost, and a definite answer of a store that is there: the run may be held at a
            # refused commit (engine/refusals.py), and a keeper that ended here would end that hold. Keep
            # renewing at the regular interval; the fence decides. Not the safety point, on purpose: the
            # module's docstring says why that would not be safe.
            log.warning("run %s: renewing its lease was refused (%s); trying again in %.1fs",
                        self.lease.run_id, exc, self.interval)
            self.refused = True
            return self.interval
        except Exception as exc:  # the store away for a moment in any other way: retry as well
            return self._failed(exc)
        self.valid_until = sent + self.ttl
        if self.failures:
            log.warning("run %s: its lease is renewed again after %d failed attempt(s); its execution goes on",
                        self.lease.run_id, self.failures)
        self.failures = 0
        self.refused = False
        return self.next_renewal()

    def _failed(self, exc: Exception) -> float:
        self.failures += 1
        self.refused = False
        left = self.safety_point - self.clock.now()
        if left <= 0:
            raise self._past_safety_point(f"the last attempt failed: {exc}")
        log.warning("run %s: renewing its lease failed (%s); retrying for another %.1fs while the lease is surely "
                    "still this worker's (attempt %d)", self.lease.run_id, exc, max(0.0, left), self.failures)
        return self.retry_delay()

    def _past_safety_point(self, why: str) -> PastSafetyPoint:
        left = self.valid_until - self.clock.now()
        # A warning, not an error: the keeper does what it is for (no two executors at once), and the run goes
        # on from its journal when claimed again. A slow API server under load meets it with short leases.
        log.warning("run %s: its lease could not be renewed (%s, %d failed attempt(s)) and could expire in %.1fs; "
                    "cancelling its execution here before another worker may claim the run; it resumes from its "
                    "journal when claimed again", self.lease.run_id, why, self.failures, max(0.0, left))
        return PastSafetyPoint(self.lease.run_id, self.lease.fence)


async def keep_lease(keeper: LeaseKeeper, store: Store, rt: RunRuntime, wf: asyncio.Task[Any],
                     cancel_once: Callable[[], None]) -> None:
    """Renew the keeper's lease until cancelled; cancel ``wf`` when the lease is lost (or may be about to be:
    the module's docstring), ``cancel_once`` on a user cancel. The renewals and the reads looking for a cancel
    go on side by side: a read that hangs (the store away) never holds a renewal back."""
    lease = keeper.lease
    poller = asyncio.create_task(_poll_cancel(keeper, store, rt, cancel_once), name=f"{lease.run_id}: cancel poll")
    try:
        await _renew_until_lost(keeper)
        wf.cancel()
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


async def _renew_until_lost(keeper: LeaseKeeper) -> None:
    """Return when the lease is lost, or when no renewal succeeded before the safety point."""
    delay = keeper.next_renewal()
    while True:
        await keeper.clock.sleep(delay)
        try:
            delay = await keeper.renew()
        except LeaseLost as exc:
            if not isinstance(exc, PastSafetyPoint):  # that one said why already
                log.error("lease on run %s lost; cancelling its execution here", keeper.lease.run_id)
            elif keeper.gave_up is not None:
                keeper.gave_up(keeper.lease)
            return


async def _poll_cancel(keeper: LeaseKeeper, store: Store, rt: RunRuntime, cancel_once: Callable[[], None]) -> None:
    """Read the run every renewal interval; call ``cancel_once`` when another process asked for a cancel."""
    run_id = keeper.lease.run_id
    while True:
        await asyncio.sleep(keeper.interval)  # the event loop's time: the keeper's clock times the renewals
        try:
            run = await store.get_run(run_id)
        except Exception as exc:
            # A failed read (the store away for a moment) must not end the keeper: the lease would then lapse
            # while the run goes on executing here, and the replica that takes the run over would execute it
            # alongside. The next poll reads again.
            log.warning("run %s: could not read it to look for a cancel (%s); looking again in %.1fs",
                        run_id, exc, keeper.interval)
            continue
        if run is not None and run.cancel_requested and rt.cancel_reason is None:
            rt.cancel_reason = run.cancel_requested
            cancel_once()
