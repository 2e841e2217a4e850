"""Who executes a run: claims of its lease (``kube/journal/leases.py``), whose transitions are the fence the head is moved
to, renewals, releases, and handing out the next runnable run."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.errors import JournalDamaged, LeaseHeld, LeaseLost, RunNotFound
from durable_sandbox.engine.records import Lease
from durable_sandbox.kube.api.client import ApiException, is_not_found, is_precondition_failed
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, LABEL_RUN, MANAGED_BY
from durable_sandbox.kube.journal.leases import LeaseBusy, LeaseGone, Leases
from durable_sandbox.kube.store.codec import LABEL_STATUS, RETRIES, dumps, lease_name, run_id_of, run_key
from durable_sandbox.kube.store.heads import RunHeads
from durable_sandbox.kube.store.side_objects import SideObjects

log = logging.getLogger("durable_sandbox.kube.store")


class RunClaims:
    """The leases of one namespace's runs, and the head fences they move."""

    def __init__(self, heads: RunHeads, leases: Leases, side: SideObjects) -> None:
        self.heads = heads
        self.objects = heads.objects
        self.leases = leases
        self.side = side

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        head = await self.heads.head(run_id)
        if head is None:
            raise RunNotFound(run_id)
        st = self.heads.state(run_id)
        key = run_key(run_id)
        try:
            fence = await self.leases.acquire(
                lease_name(run_id), owner, ttl, floor=st.fence, take_over_from=take_over_from,
                labels={**MANAGED_BY, LABEL_RUN: key, LABEL_PART: "lease"}, owners=st.owners, run=run_id,
            )
        except LeaseBusy as busy:
            raise LeaseHeld(run_id, busy.holder, time.time() + busy.remaining) from None
        head = await self._move_fence(run_id, owner, ttl, fence, head)
        redo = self.heads.loads(run_id, key, head.get("data") or {}, "redo", self.heads.state(run_id).name, "null")
        if redo:
            await self.side.apply_redo(redo, only_if_ours=True)
        return Lease(run_id, owner, fence, time.time() + ttl)

    async def _move_fence(self, run_id: str, owner: str, ttl: float, fence: int,
                          head: dict[str, Any]) -> dict[str, Any]:
        """The lease is ours at ``fence``: move the head's fence to it, so older holders can no longer write.
        Returns the head the patch was tested against."""
        key = run_key(run_id)
        st = self.heads.state(run_id)
        for _ in range(RETRIES):
            if st.fence >= fence:  # a newer claim already moved it: we lost the race after all
                holder = await self.heads.field(run_id, head.get("data") or {}, "lease_owner", st.name)
                raise LeaseHeld(run_id, holder or "?", time.time() + ttl)
            ops = [
                {"op": "test", "path": "/data/fence", "value": str(st.fence)},
                {"op": "replace", "path": "/data/fence", "value": str(fence)},
                {"op": "add", "path": "/data/run.lease_owner",
                 "value": self.heads.sealed(key, "run.lease_owner", dumps(owner))},
            ]
            try:
                await self.objects.patch(st.name, ops)
            except ApiException as exc:
                if is_not_found(exc):
                    raise RunNotFound(run_id) from None
                if not is_precondition_failed(exc):
                    raise
                again = await self.heads.head(run_id)
                if again is None:
                    raise RunNotFound(run_id) from None
                head, st = again, self.heads.state(run_id)
                continue
            st.fence = fence
            return head
        raise LeaseHeld(run_id, "?", time.time() + ttl)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        try:
            await self.leases.renew(lease_name(lease.run_id), lease.owner, lease.fence, ttl)
        except LeaseGone:
            raise LeaseLost(lease.run_id, lease.fence) from None
        return Lease(lease.run_id, lease.owner, lease.fence, time.time() + ttl)

    async def release(self, lease: Lease) -> None:
        await self.leases.release(lease_name(lease.run_id), lease.owner, lease.fence)

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None,
                         build: BuildClaims | None = None) -> Lease | None:
        selector = f"{LABEL_PART}=run,{LABEL_STATUS} in (pending,waiting,running,suspended)"
        heads, leases = await asyncio.gather(self.objects.select(selector), self.leases.list(f"{LABEL_PART}=lease"))
        now = time.time()
        candidates: list[tuple[float, str]] = []
        for head in heads:
            run_id, where = run_id_of(head), head["metadata"]["name"]
            data = head.get("data") or {}
            try:
                status, wake_at, cancel, workflow, updated_at, labels = [
                    await self.heads.field(run_id, data, f, where)
                    for f in ("status", "wake_at", "cancel_requested", "workflow", "updated_at", "labels")]
            except JournalDamaged as exc:
                log.warning("%s", exc)  # never handed out; the other runs go on
                continue
            runnable = (
                status in ("pending", "running")
                or (status == "waiting" and wake_at is not None and wake_at <= now)
                or (cancel is not None and status in ("waiting", "suspended"))
            )
            if not runnable:
                continue
            if workflows and workflow not in workflows:
                continue
            if build is not None and not build.admits_labels(workflow, labels or {}):
                continue  # pinned to another build (its sealed run labels): a worker of that build's
            lease = leases.get(lease_name(run_id))
            if lease is not None and not self.leases.vacant(lease):
                continue  # held, by another worker or by this one: not ours to hand out again
            candidates.append((float(updated_at or 0), run_id))
        for _, run_id in sorted(candidates):
            try:
                return await self.claim(run_id, owner, ttl)
            except (LeaseHeld, RunNotFound):
                continue  # another replica was faster, or the run is gone
        return None
