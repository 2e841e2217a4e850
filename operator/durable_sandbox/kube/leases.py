"""``coordination.k8s.io/v1`` Leases: who executes a run (Lease ``dsb.<run>``) or reconciles a Sandbox
(Lease ``dsbx.<uid>``), with a fencing epoch.

- **Claim** = an update conditional on the Lease's ``resourceVersion`` (a replace carrying the version we
  read: the apiserver refuses it with 409 if anyone wrote in between), so two replicas can never both win.
- **Fencing epoch** = ``spec.leaseTransitions``: every successful claim increments it (a re-claim by the same
  holder too), and the store refuses journal writes carrying an older epoch.
- **Renewal** touches only the Lease (one write).
- **Expiry** is judged from the Lease's own ``leaseDurationSeconds`` and a *local monotonic* clock: a held
  Lease is expired once its ``resourceVersion`` has not changed for ``leaseDurationSeconds`` as measured by
  this process since it first saw that version (what client-go's leader election does). ``renewTime`` is
  written for people reading ``kubectl get lease``, never compared with our wall clock: two machines'
  clocks may disagree by more than a lease lasts.
- **Release** clears the holder, so another replica takes the run over at once (SIGTERM handover) instead
  of waiting for an expiry.

:class:`Leases` is the machinery (one namespace, as one process sees it); the store uses it for runs, whose
renewals the engine's executor drives. :class:`HeldLease` is one Lease a process keeps while it works on
one object (a Sandbox): renewed in the background at a third of its length, and reported lost (so the work
stops) as soon as it is not ours any more or has not been renewed for a whole lease period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes.aio.client import models as m

from durable_sandbox.kube.client import KubeClient, is_conflict, is_not_found
from durable_sandbox.kube.metrics import METRICS

log = logging.getLogger("durable_sandbox.kube.leases")

__all__ = ["HeldLease", "LeaseBusy", "LeaseGone", "Leases"]


class LeaseBusy(Exception):
    """Another holder has a live lease."""

    def __init__(self, name: str, holder: str, remaining: float) -> None:
        self.holder = holder
        self.remaining = remaining
        super().__init__(f"Lease {name!r} is held by {holder!r} (expires in at most {remaining:.0f}s by our clock)")


class LeaseGone(Exception):
    """The lease is no longer ours at this epoch (taken over, released, or deleted)."""


def _micro(when: datetime | None) -> datetime | None:
    """The client serialises with isoformat(), which drops a zero fraction; MicroTime needs six digits."""
    return when.replace(microsecond=1) if when is not None and when.microsecond == 0 else when


@dataclass(frozen=True, slots=True)
class _Seen:
    resource_version: str
    at: float  # local monotonic time when this resourceVersion was first observed


class Leases:
    """The Leases of one namespace, as one process sees them (``clock`` is its monotonic clock)."""

    def __init__(self, client: KubeClient, namespace: str, *, clock: Callable[[], float] = time.monotonic,
                 field_manager: str = "durable-sandbox") -> None:
        self.client = client
        self.namespace = namespace
        self.clock = clock
        self.field_manager = field_manager
        self._seen: dict[str, _Seen] = {}
        self._mine: dict[str, m.V1Lease] = {}  # the last version we wrote of each lease we hold
        self.writes = 0

    # ------------------------------------------------------------------ observation

    def observe(self, lease: m.V1Lease) -> None:
        name = lease.metadata.name  # type: ignore[union-attr]
        rv = lease.metadata.resource_version  # type: ignore[union-attr]
        seen = self._seen.get(name)  # type: ignore[arg-type]
        if seen is None or seen.resource_version != rv:
            self._seen[name] = _Seen(rv, self.clock())  # type: ignore[index, arg-type]

    def remaining(self, lease: m.V1Lease) -> float:
        """Seconds until the holder's lease runs out by our clock; 0 when free or expired."""
        self.observe(lease)
        spec = lease.spec
        if spec is None or not spec.holder_identity:
            return 0.0
        seen = self._seen[lease.metadata.name]  # type: ignore[union-attr, index]
        return max(0.0, (spec.lease_duration_seconds or 0) - (self.clock() - seen.at))

    def vacant(self, lease: m.V1Lease) -> bool:
        """Nobody holds it, or the holder's time ran out."""
        spec = lease.spec
        return spec is None or not spec.holder_identity or self.remaining(lease) <= 0

    def free_for(self, lease: m.V1Lease, holder: str) -> bool:
        spec = lease.spec
        return spec is None or spec.holder_identity in (None, "", holder) or self.remaining(lease) <= 0

    async def read(self, name: str) -> m.V1Lease | None:
        try:
            lease = await self.client.coordination.read_namespaced_lease(name, self.namespace)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        self.observe(lease)
        return lease

    async def list(self, label_selector: str) -> dict[str, m.V1Lease]:
        leases = await self.client.coordination.list_namespaced_lease(self.namespace, label_selector=label_selector)
        out: dict[str, m.V1Lease] = {}
        for lease in leases.items:
            self.observe(lease)
            out[lease.metadata.name] = lease  # type: ignore[union-attr, index]
        return out

    # ------------------------------------------------------------------ claim, renew, release

    @staticmethod
    def _now() -> datetime:
        now = datetime.now(UTC)  # informational only (kubectl get lease); never compared
        return now.replace(microsecond=1) if now.microsecond == 0 else now

    async def acquire(self, name: str, holder: str, ttl: float, *, floor: int = 0, take_over_from: str | None = None,
                      labels: dict[str, str] | None = None,
                      owners: Sequence[m.V1OwnerReference] | None = None) -> int:
        """Take the lease for ``holder``; returns the new epoch (> ``floor``). Raises ``LeaseBusy``.

        ``take_over_from``: also take it while exactly that holder has it live (one the caller proved dead);
        the conditional replace still fails if anyone else got it in between."""
        duration = max(1, math.ceil(ttl))
        lease = await self.read(name)
        if lease is None:
            body = m.V1Lease(
                metadata=m.V1ObjectMeta(name=name, labels=labels, owner_references=list(owners) if owners else None),
                spec=m.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=duration, lease_transitions=floor + 1,
                                   acquire_time=self._now(), renew_time=self._now()),
            )
            try:
                self.writes += 1
                created = await self.client.coordination.create_namespaced_lease(
                    self.namespace, body, field_manager=self.field_manager
                )
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                # Someone created it first: they hold it now.
                lease = await self.read(name)
                if lease is None:
                    raise
                who = lease.spec.holder_identity if lease.spec is not None else None
                raise LeaseBusy(name, who or "?", self.remaining(lease)) from None
            self._took(created)
            return floor + 1
        spec = lease.spec or m.V1LeaseSpec()
        if not self.free_for(lease, holder) and not (take_over_from and spec.holder_identity == take_over_from):
            raise LeaseBusy(name, spec.holder_identity or "?", self.remaining(lease))
        epoch = max(spec.lease_transitions or 0, floor) + 1
        now = self._now()
        lease.spec = m.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=duration, lease_transitions=epoch,
                                   acquire_time=now, renew_time=now)
        try:
            self.writes += 1
            # metadata.resourceVersion is the one we read: a concurrent claim makes this a 409.
            updated = await self.client.coordination.replace_namespaced_lease(
                name, self.namespace, lease, field_manager=self.field_manager
            )
        except Exception as exc:
            if not is_conflict(exc):
                raise
            current = await self.read(name)
            who = current.spec.holder_identity if current is not None and current.spec else None
            raise LeaseBusy(name, who or "?", self.remaining(current) if current is not None else 0.0) from None
        self._took(updated)
        if spec.holder_identity not in (None, "", holder):
            # Released leases have no holder: taking one that still names another worker is a takeover.
            METRICS.lease_takeovers.inc()
        return epoch

    def _took(self, lease: m.V1Lease) -> None:
        self.observe(lease)
        self._mine[lease.metadata.name] = lease  # type: ignore[union-attr, index]

    async def _current_for(self, name: str, holder: str, epoch: int) -> m.V1Lease:
        lease = self._mine.get(name)
        if lease is None or lease.spec is None or lease.spec.lease_transitions != epoch:
            lease = await self.read(name)
        if (lease is None or lease.spec is None or lease.spec.holder_identity != holder
                or lease.spec.lease_transitions != epoch):
            self._mine.pop(name, None)
            raise LeaseGone(name)
        return lease

    async def renew(self, name: str, holder: str, epoch: int, ttl: float) -> None:
        """Extend our lease; ``LeaseGone`` if it is no longer ours at ``epoch``."""
        for _ in range(3):
            lease = await self._current_for(name, holder, epoch)
            spec = lease.spec
            assert spec is not None
            spec.renew_time = self._now()
            spec.acquire_time = _micro(spec.acquire_time)
            spec.lease_duration_seconds = max(1, math.ceil(ttl))
            try:
                self.writes += 1
                updated = await self.client.coordination.replace_namespaced_lease(
                    name, self.namespace, lease, field_manager=self.field_manager
                )
            except Exception as exc:
                if is_not_found(exc):
                    raise LeaseGone(name) from None
                if not is_conflict(exc):
                    raise
                self._mine.pop(name, None)  # re-read and check it is still ours
                continue
            self._took(updated)
            return
        raise LeaseGone(name)

    async def release(self, name: str, holder: str, epoch: int) -> None:
        """Clear the holder if the lease is still ours at ``epoch``; otherwise do nothing."""
        for _ in range(3):
            try:
                lease = await self._current_for(name, holder, epoch)
            except LeaseGone:
                return
            assert lease.spec is not None
            lease.spec.holder_identity = None
            lease.spec.acquire_time = None
            lease.spec.renew_time = self._now()
            try:
                self.writes += 1
                updated = await self.client.coordination.replace_namespaced_lease(
                    name, self.namespace, lease, field_manager=self.field_manager
                )
            except Exception as exc:
                if is_not_found(exc):
                    return
                if not is_conflict(exc):
                    raise
                self._mine.pop(name, None)
                continue
            self.observe(updated)
            self._mine.pop(name, None)
            return


class HeldLease:
    """One Lease this process keeps while it works on one object (the other replicas wait for it).

    :meth:`take` acquires it (``LeaseBusy`` while another holder's is live) and starts the background
    renewal; ``on_lost`` is called once when it stops being ours (taken over, deleted, or not renewed for
    a whole lease period because the API server could not be reached): the holder must stop acting then,
    as another replica may start. :meth:`release` hands it over at once (SIGTERM)."""

    def __init__(self, leases: Leases, name: str, holder: str, ttl: float, *, labels: dict[str, str] | None = None,
                 owners: Sequence[m.V1OwnerReference] | None = None, on_lost: Callable[[], None] | None = None) -> None:
        self.leases = leases
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.labels = labels
        self.owners = owners
        self.on_lost = on_lost
        self.epoch: int | None = None
        self._renewer: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        return self.epoch is not None

    async def take(self) -> int:
        """Hold it (a no-op while held); returns the epoch. Raises ``LeaseBusy``."""
        if self.epoch is not None:
            return self.epoch
        self.epoch = await self.leases.acquire(self.name, self.holder, self.ttl, labels=self.labels, owners=self.owners)
        self._renewer = asyncio.get_running_loop().create_task(self._renew(self.epoch))
        return self.epoch

    async def _renew(self, epoch: int) -> None:
        renewed = self.leases.clock()
        while True:
            # A third of the lease: two renewals may fail (API server busy) before the others may take it.
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.leases.renew(self.name, self.holder, epoch, self.ttl)
                renewed = self.leases.clock()
                continue
            except LeaseGone:
                log.warning("lease %s/%s is no longer held by %s (taken over or deleted)",
                            self.leases.namespace, self.name, self.holder)
            except Exception as exc:
                if self.leases.clock() - renewed < self.ttl:
                    log.warning("renewing lease %s/%s failed, trying again: %s: %s",
                                self.leases.namespace, self.name, type(exc).__name__, exc)
                    continue
                log.warning("lease %s/%s not renewed for %gs (%s: %s): another replica may hold it now",
                            self.leases.namespace, self.name, self.ttl, type(exc).__name__, exc)
            break
        self.epoch = None
        self._renewer = None
        if self.on_lost is not None:
            self.on_lost()

    async def _stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not asyncio.current_task():
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def release(self) -> None:
        """Stop renewing and clear the holder, so another replica takes it over at once."""
        await self._stop_renewing()
        epoch, self.epoch = self.epoch, None
        if epoch is not None:
            await self.leases.release(self.name, self.holder, epoch)

    async def forget(self) -> None:
        """Stop renewing without writing (the object and its Lease are being deleted)."""
        await self._stop_renewing()
        self.epoch = None
