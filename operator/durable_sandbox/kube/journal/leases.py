"""Leases: who executes a run (``dsb.<run>.lease``) or reconciles a Sandbox (``dsbx.<uid>``), with a fencing
epoch. Each is a ``Journal`` object (part ``lease``), the operator's own kind: the same semantics as a
``coordination.k8s.io/v1`` Lease (holder, duration, transitions), but out of reach of namespace roles, which
grant Leases, and without giving the operator rights over every Lease of the cluster (kube-system's
leader elections, ``kube-node-lease``). Its ``data``: ``holder``, ``durationSeconds``, ``transitions``,
``acquireTime``, ``renewTime``.

- **Claim** = an update conditional on the object's ``resourceVersion`` (a replace carrying the version we
  read: the apiserver refuses it with 409 if anyone wrote in between), so two replicas can never both win.
- **Fencing epoch** = ``transitions``: every successful claim increments it (a re-claim by the same holder
  too), and the store refuses journal writes carrying an older epoch.
- **Renewal** touches only the lease (one write).
- **Expiry** is judged from the lease's own ``durationSeconds`` and a *local monotonic* clock: a held lease is
  expired once its ``resourceVersion`` has not changed for ``durationSeconds`` as measured by this process
  since it first saw that version (what client-go's leader election does). ``renewTime`` is written for
  people, never compared with our wall clock: two machines' clocks may disagree by more than a lease lasts.
- **Release** clears the holder, so another replica takes the run over at once (SIGTERM handover) instead
  of waiting for an expiry.

:class:`Leases` is the machinery (one namespace, as one process sees it); the store uses it for runs, whose
renewals the engine's executor drives. :class:`HeldLease` is one lease a process keeps while it works on
one object (a Sandbox): renewed in the background at a third of its length, and reported lost (so the work
stops) as soon as it is not ours any more or was not renewed before its safety point (a third of the lease
before another replica may take it, the engine's rule: engine/lease_keeper.py).
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
from typing import Any

from durable_sandbox.engine.lease_keeper import FIRST_RETRY_FRACTION, SAFETY_FRACTION, LeaseClock, SystemClock
from durable_sandbox.kube.api.client import KubeClient, brief, is_conflict, is_not_found
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, MANAGED_BY, JournalObjects

log = logging.getLogger("durable_sandbox.kube.journal.leases")

__all__ = ["HeldLease", "LeaseBusy", "LeaseGone", "LeaseObject", "Leases"]


class LeaseBusy(Exception):
    """Another holder has a live lease."""

    def __init__(self, name: str, holder: str, remaining: float) -> None:
        self.holder = holder
        self.remaining = remaining
        super().__init__(f"Lease {name!r} is held by {holder!r} (expires in at most {remaining:.0f}s by our clock)")


class LeaseGone(Exception):
    """The lease is no longer ours at this epoch (taken over, released, or deleted)."""


@dataclass(slots=True)
class LeaseObject:
    """One lease as read from the API server (its whole body, so it can be written back conditionally)."""

    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def resource_version(self) -> str:
        return str(self.body["metadata"].get("resourceVersion", ""))

    @property
    def data(self) -> dict[str, str]:
        data: dict[str, str] = self.body.setdefault("data", {})
        return data

    @property
    def holder(self) -> str | None:
        return self.data.get("holder") or None

    @property
    def duration(self) -> int:
        return _int(self.data.get("durationSeconds"))

    @property
    def transitions(self) -> int:
        return _int(self.data.get("transitions"))

    def set(self, *, holder: str | None, duration: int | None = None, transitions: int | None = None,
            acquired: bool = False) -> None:
        now = _now()
        self.data["holder"] = holder or ""
        if duration is not None:
            self.data["durationSeconds"] = str(duration)
        if transitions is not None:
            self.data["transitions"] = str(transitions)
        if acquired or not holder:
            self.data["acquireTime"] = now if holder else ""
        self.data["renewTime"] = now


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _now() -> str:
    # Informational only (people read it); never compared with anyone's clock.
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class _Seen:
    resource_version: str
    at: float  # local monotonic time when this resourceVersion was first observed


class Leases:
    """The leases of one namespace, as one process sees them (``clock`` is its monotonic clock)."""

    def __init__(self, client: KubeClient, namespace: str, *, clock: Callable[[], float] = time.monotonic,
                 field_manager: str = "durable-sandbox") -> None:
        self.client = client
        self.objects = JournalObjects(client, namespace, field_manager=field_manager)
        self.namespace = namespace
        self.clock = clock
        self.field_manager = field_manager
        self._seen: dict[str, _Seen] = {}
        self._mine: dict[str, LeaseObject] = {}  # the last version we wrote of each lease we hold
        self.writes = 0

    # ------------------------------------------------------------------ observation

    def observe(self, lease: LeaseObject) -> None:
        seen = self._seen.get(lease.name)
        if seen is None or seen.resource_version != lease.resource_version:
            self._seen[lease.name] = _Seen(lease.resource_version, self.clock())

    def remaining(self, lease: LeaseObject) -> float:
        """Seconds until the holder's lease runs out by our clock; 0 when free or expired."""
        self.observe(lease)
        if not lease.holder:
            return 0.0
        seen = self._seen[lease.name]
        return max(0.0, lease.duration - (self.clock() - seen.at))

    def vacant(self, lease: LeaseObject) -> bool:
        """Nobody holds it, or the holder's time ran out."""
        return not lease.holder or self.remaining(lease) <= 0

    def free_for(self, lease: LeaseObject, holder: str) -> bool:
        return lease.holder in (None, holder) or self.remaining(lease) <= 0

    async def read(self, name: str) -> LeaseObject | None:
        body = await self.objects.get(name)
        if body is None:
            return None
        lease = LeaseObject(body)
        self.observe(lease)
        return lease

    async def list(self, label_selector: str) -> dict[str, LeaseObject]:
        out: dict[str, LeaseObject] = {}
        for body in await self.objects.select(label_selector):
            lease = LeaseObject(body)
            self.observe(lease)
            out[lease.name] = lease
        return out

    async def _write(self, lease: LeaseObject) -> LeaseObject:
        """Replace ``lease`` conditional on the resourceVersion it was read at (409 if anyone wrote since)."""
        self.writes += 1
        return LeaseObject(await self.objects.replace(lease.body))

    # ------------------------------------------------------------------ claim, renew, release

    async def acquire(self, name: str, holder: str, ttl: float, *, floor: int = 0, take_over_from: str | None = None,
                      labels: dict[str, str] | None = None, owners: Sequence[dict[str, Any]] | None = None,
                      run: str = "") -> int:
        """Take the lease for ``holder``; returns the new epoch (> ``floor``). Raises ``LeaseBusy``.

        ``take_over_from``: also take it while exactly that holder has it live (one the caller proved dead);
        the conditional replace still fails if anyone else got it in between."""
        duration = max(1, math.ceil(ttl))
        lease = await self.read(name)
        if lease is None:
            meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
            if owners:
                meta["ownerReferences"] = list(owners)
            new = LeaseObject(JournalObjects.body(meta, {}, run=run, part="lease"))
            new.set(holder=holder, duration=duration, transitions=floor + 1, acquired=True)
            try:
                self.writes += 1
                created = await self.objects.create(new.body)
            except Exception as exc:
                if not is_conflict(exc):
                    raise
                # Someone created it first: they hold it now.
                lease = await self.read(name)
                if lease is None:
                    raise
                raise LeaseBusy(name, lease.holder or "?", self.remaining(lease)) from None
            self._took(LeaseObject(created))
            return floor + 1
        previous = lease.holder
        if not self.free_for(lease, holder) and not (take_over_from and previous == take_over_from):
            raise LeaseBusy(name, previous or "?", self.remaining(lease))
        epoch = max(lease.transitions, floor) + 1
        lease.set(holder=holder, duration=duration, transitions=epoch, acquired=True)
        try:
            updated = await self._write(lease)
        except Exception as exc:
            if not is_conflict(exc):
                raise
            current = await self.read(name)
            who = current.holder if current is not None else None
            raise LeaseBusy(name, who or "?", self.remaining(current) if current is not None else 0.0) from None
        self._took(updated)
        if previous not in (None, holder):
            # Released leases have no holder: taking one that still names another worker is a takeover.
            if self.client.metrics is not None:
                self.client.metrics.lease_takeovers.inc()
        return epoch

    def _took(self, lease: LeaseObject) -> None:
        self.observe(lease)
        self._mine[lease.name] = lease

    async def _current_for(self, name: str, holder: str, epoch: int) -> LeaseObject:
        lease = self._mine.get(name)
        if lease is None or lease.transitions != epoch:
            lease = await self.read(name)
        if lease is None or lease.holder != holder or lease.transitions != epoch:
            self._mine.pop(name, None)
            raise LeaseGone(name)
        return lease

    async def renew(self, name: str, holder: str, epoch: int, ttl: float) -> None:
        """Extend our lease; ``LeaseGone`` if it is no longer ours at ``epoch``."""
        for _ in range(3):
            lease = await self._current_for(name, holder, epoch)
            lease.set(holder=holder, duration=max(1, math.ceil(ttl)))
            try:
                updated = await self._write(lease)
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
            lease.set(holder=None)
            try:
                updated = await self._write(lease)
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
    renewal, every third of the lease; ``on_lost`` is called once when it stops being ours: taken over or
    deleted (at once), or not renewed before the *safety point*, the engine's rule (engine/lease_keeper.py):
    ``sent + ttl - ttl * SAFETY_FRACTION``, ``sent`` read on this process's monotonic clock before the last
    renewal that succeeded was sent (another replica counts the lease's whole period from no earlier than that
    write reaching the API server, by its own clock), so the holder stops acting a third of the lease before
    another replica may start. Failed renewals are retried with the engine's backoff until then, each attempt
    bounded by the time left. :meth:`release` hands it over at once (SIGTERM)."""

    def __init__(self, leases: Leases, name: str, holder: str, ttl: float, *, labels: dict[str, str] | None = None,
                 owners: Sequence[dict[str, Any]] | None = None, on_lost: Callable[[], None] | None = None,
                 run: str = "", clock: LeaseClock | None = None) -> None:
        self.leases = leases
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.labels = labels
        self.owners = owners
        self.on_lost = on_lost
        self.run = run
        self.clock: LeaseClock = clock if clock is not None else SystemClock()
        self.interval = max(ttl / 3, 0.05)
        self.epoch: int | None = None
        self.sent = 0.0  # monotonic time the last successful acquire or renewal was sent
        self._renewer: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        return self.epoch is not None

    @property
    def safety_point(self) -> float:
        """Monotonic time past which the holder must not act under the lease."""
        return self.sent + self.ttl - self.ttl * SAFETY_FRACTION

    async def take(self) -> int:
        """Hold it (a no-op while held); returns the epoch. Raises ``LeaseBusy``."""
        if self.epoch is not None:
            return self.epoch
        sent = self.clock.now()
        self.epoch = await self.leases.acquire(self.name, self.holder, self.ttl, labels=self.labels, owners=self.owners,
                                               run=self.run)
        self.sent = sent
        self._renewer = asyncio.get_running_loop().create_task(self._renew(self.epoch))
        return self.epoch

    def _where(self) -> str:
        return f"{self.leases.namespace}/{self.name}"

    async def _renew(self, epoch: int) -> None:
        failures, delay = 0, self.interval
        while True:
            await self.clock.sleep(delay)
            left = self.safety_point - self.clock.now()
            if left <= 0 and failures:
                break
            sent = self.clock.now()
            try:
                # On time, ``left`` is a third of the lease; a holder that wakes late (its event loop stalled) tries
                # once for an interval: a renewal that succeeds proves the epoch did not move.
                async with asyncio.timeout(left if failures else max(left, self.interval)):
                    await self.leases.renew(self.name, self.holder, epoch, self.ttl)
            except LeaseGone:
                log.warning("lease %s is no longer held by %s (taken over or deleted)", self._where(), self.holder)
                self._lost()
                return
            except Exception as exc:  # the API server away or failing (a renewal timed out included): retry
                failures += 1
                left = self.safety_point - self.clock.now()
                if left <= 0:
                    break
                if not self.leases.client.away.unreachable(exc, f"renewing lease {self._where()}"):
                    log.warning("renewing lease %s failed, trying again for %.1fs: %s", self._where(), left,
                                brief(exc) if not isinstance(exc, TimeoutError) else "no answer in time")
                delay = min(self.interval * FIRST_RETRY_FRACTION * 2 ** (failures - 1), self.interval, left)
                continue
            self.sent, failures = sent, 0
            delay = max(0.0, sent + self.interval - self.clock.now())
        log.warning("lease %s not renewed since %.1fs ago (%d failed attempt(s)): %s stops acting under it before "
                    "another replica may take it", self._where(), self.clock.now() - self.sent, failures, self.holder)
        self._lost()

    def _lost(self) -> None:
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


class ObjectLeases:
    """Which replica reconciles each object of a kind (a Sandbox, a SandboxPool): a lease per object, named
    ``<prefix>.<uid>``, owned by the object (the cluster deletes it with it) and labelled with its name; one
    :class:`Leases` per namespace, made on first use."""

    def __init__(self, client: KubeClient, *, field_manager: str, api_version: str, kind: str, prefix: str,
                 name_label: str) -> None:
        self.client = client
        self.field_manager = field_manager
        self.api_version, self.kind, self.prefix, self.name_label = api_version, kind, prefix, name_label
        self._by_namespace: dict[str, Leases] = {}

    def lease(self, namespace: str, name: str, uid: str, *, holder: str, ttl: float,
              on_lost: Callable[[], None] | None = None) -> HeldLease:
        leases = self._by_namespace.get(namespace)
        if leases is None:
            leases = self._by_namespace[namespace] = Leases(self.client, namespace, field_manager=self.field_manager)
        owner = {"apiVersion": self.api_version, "kind": self.kind, "name": name, "uid": uid}
        labels = {**MANAGED_BY, self.name_label: label_value(name), LABEL_PART: "lease"}
        return HeldLease(leases, f"{self.prefix}.{uid}", holder, ttl, labels=labels, owners=[owner], on_lost=on_lost,
                         run=name)
