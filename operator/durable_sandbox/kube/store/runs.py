"""Run records in their heads: create, read, list, change (unfenced or fenced) and delete a run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged, LeaseLost, RunNotFound
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.api.client import ApiException, is_conflict, is_not_found, is_precondition_failed
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, LABEL_RUN, JournalObjects
from durable_sandbox.kube.journal.leases import Leases
from durable_sandbox.kube.store.codec import (
    ANNOTATION_RUN,
    INLINE_FIELD_BYTES,
    LABEL_STATUS,
    RETRIES,
    RUN_FIELDS,
    OwnerRef,
    dumps,
    field_value,
    head_name,
    jp,
    lease_name,
    object_meta,
    run_id_of,
    run_key,
)
from durable_sandbox.kube.store.heads import RunHeads


class Runs:
    """The run records of one namespace."""

    def __init__(self, heads: RunHeads, leases: Leases) -> None:
        self.heads = heads
        self.objects = heads.objects
        self.leases = leases

    async def create_run(self, run: RunRecord, *, owner: OwnerRef | None = None) -> tuple[RunRecord, bool]:
        """Insert ``run`` unless its id exists. ``owner``: the Workflow whose deletion deletes the run."""
        key = run_key(run.run_id)
        existing = await self.heads.head(run.run_id)
        if existing is not None:  # the common case (every admission of a run that exists): one GET
            return await self.heads.run_from_head(existing), False
        owners = [owner.to_json()] if owner else []
        sealed = self.heads.sealed
        data: dict[str, str] = {"fence": "0", "seq": "0", "chunks": sealed(key, "chunks", "[]"),
                                "signals": sealed(key, "signals", "{}")}
        for f in RUN_FIELDS:
            value = field_value(f, getattr(run, f))
            stored = await self.heads.blobs.put_value(key, dumps(value), INLINE_FIELD_BYTES, owners)
            data[f"run.{f}"] = sealed(key, f"run.{f}", stored)
        meta = object_meta(f"dsb.{key}", key, "run", owners, {LABEL_STATUS: run.status.value})
        meta["annotations"] = {ANNOTATION_RUN: run.run_id}
        lease = await self.leases.read(lease_name(run.run_id))
        if lease is not None:
            # Its lease outlives the head only if the head was deleted behind the store's back (they go together
            # otherwise): the run ran, and starting it afresh would execute every committed call again.
            raise JournalDamaged(
                run.run_id, f"Journal {self.heads.namespace}/dsb.{key}",
                f"the run's head is missing while its lease {lease.name} shows it was executed "
                f"({lease.transitions} claim(s))", tampered=False, lost=True)
        try:
            head = await self.objects.create(JournalObjects.body(meta, data))
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            existing = await self.heads.head(run.run_id)
            if existing is None:  # deleted in between: try once more
                return await self.create_run(run, owner=owner)
            return await self.heads.run_from_head(existing), False
        self.heads.state_from_head(run.run_id, head)
        return run, True

    async def get_run(self, run_id: str) -> RunRecord | None:
        head = await self.heads.head(run_id)
        return None if head is None else await self.heads.run_from_head(head)

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        selector = f"{LABEL_PART}=run"
        if status:
            selector += f",{LABEL_STATUS} in ({','.join(RunStatus(s).value for s in status)})"
        heads = await self.objects.select(selector)
        if workflow is not None:
            heads = [h for h in heads
                     if await self.heads.field(run_id_of(h), h.get("data") or {}, "workflow",
                                               h["metadata"]["name"]) == workflow]
        runs = await asyncio.gather(*(self.heads.run_from_head(h) for h in heads))
        return sorted(runs, key=lambda r: r.created_at, reverse=True)[:limit]

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        """Delete the head first (the run disappears for every reader at once, conditional on the version
        whose fence we checked), then the run's other objects by label. Its events object goes before the
        head, so a run created again under the same id never inherits old events; leftovers of a crash in
        between (chunks, blobs) are never read: a new head lists no chunks."""
        name = head_name(run_id)
        for _ in range(RETRIES):
            head = await self.objects.get(name)
            if head is None:
                return False
            if fence is not None and int((head.get("data") or {}).get("fence", "0")) != fence:
                raise LeaseLost(run_id, fence)
            await self.objects.delete(f"{name}.events")
            try:
                if not await self.objects.delete(name, resource_version=head["metadata"]["resourceVersion"]):
                    return False
            except ApiException as exc:
                if is_conflict(exc):
                    continue  # written since we checked the fence: check again
                raise
            break
        else:
            raise RuntimeError(f"Could not delete run {run_id!r}: its head kept changing")
        self.heads.forget(run_id)
        await self.objects.delete_all(f"{LABEL_RUN}={run_key(run_id)}")  # chunks, blobs and the run's lease
        return True

    async def field_ops(self, run_id: str, changes: dict[str, Any], owners: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The head patch ops that set ``changes`` (and ``updated_at``), large values put in blobs first."""
        key = run_key(run_id)
        ops: list[dict[str, Any]] = []
        for name, value in {**changes, "updated_at": time.time()}.items():
            if name not in RUN_FIELDS:
                raise ValueError(f"{name!r} is not a run field a store can change (known: {', '.join(RUN_FIELDS)})")
            encoded = await self.heads.blobs.put_value(key, dumps(field_value(name, value)), INLINE_FIELD_BYTES,
                                                       owners)
            ops.append({"op": "add", "path": jp("data", f"run.{name}"),
                        "value": self.heads.sealed(key, f"run.{name}", encoded)})
            if name == "status":
                ops.append({"op": "add", "path": jp("metadata", "labels", LABEL_STATUS),
                            "value": RunStatus(value).value})
        return ops

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        owners = await self.heads.owners(run_id)
        ops = await self.field_ops(run_id, changes, owners)
        if fence is not None:
            ops.insert(0, {"op": "test", "path": "/data/fence", "value": str(fence)})
        try:
            await self.objects.patch(head_name(run_id), ops)
        except ApiException as exc:
            if is_not_found(exc):
                if fence is not None:
                    raise LeaseLost(run_id, fence) from None
                raise RunNotFound(run_id) from None
            if fence is not None and is_precondition_failed(exc):
                await self.heads.head(run_id)
                raise LeaseLost(run_id, fence) from None
            raise
