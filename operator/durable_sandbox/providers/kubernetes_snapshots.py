"""The kubernetes provider's snapshots: ``tar`` of the workspace volume streamed from the exec to the S3 store
as it comes (memory bounded whatever the size), and back into a fresh Pod for a restore."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import AsyncIterator

from durable_sandbox.providers import kubernetes_scripts as scripts
from durable_sandbox.providers.archive_limit import ArchiveBudget, ArchiveTooLarge
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    Capability,
    ProviderError,
    ProvisionError,
    SandboxHandle,
    SandboxSpec,
    SnapshotEntry,
    UnsupportedCapability,
    tag_key,
)
from durable_sandbox.providers.kubernetes_connection import SNAPSHOT_LIMIT_SETTING
from durable_sandbox.providers.kubernetes_provisioning import PodProvisioning
from durable_sandbox.providers.output import OutputBuffer
from durable_sandbox.providers.s3_snapshots import S3SnapshotStore, SnapshotMissing, SnapshotName

log = logging.getLogger("durable_sandbox.providers.kubernetes")

__all__ = ["PodSnapshots"]

STALE_UPLOAD_SECONDS = 3600.0  # an unfinished snapshot upload older than this is a dead taking's


class PodSnapshots(PodProvisioning):
    """Snapshots of the workspace volume, restores, and the store's inventory."""

    def _store(self, capability: Capability) -> S3SnapshotStore:
        # What the provider advertises decides, not what this shared code could do: a provider built on it that
        # does not advertise a capability (agent-sandbox: no snapshot copy) refuses it before acting.
        if self.store is None or not self.capabilities().supports(capability):
            raise UnsupportedCapability(self.name, capability)
        return self.store

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        store = self._store(Capability.SNAPSHOT)
        labels = handle.metadata.get("labels") or {}
        owner = handle.metadata.get("owner")
        name = SnapshotName.for_operation(operation_id, installation=labels.get(INSTALLATION_LABEL),
                                          owner=owner if isinstance(owner, str) else None,
                                          retained=RETAIN_LABEL in labels)
        # Reconciliation first: a retry after a lost answer finds the stored one even if the Pod is gone.
        if await store.exists(name):
            return name.id
        await self._require_live(handle)
        err = OutputBuffer(4096)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=8)  # bounded: the exec waits for the store
        budget = ArchiveBudget(self.snapshot_limit, f"snapshot of {handle.id}", SNAPSHOT_LIMIT_SETTING)
        abandoned = asyncio.Event()  # the upload stopped reading (failed, or the archive passed the limit)

        async def produce() -> int:
            try:
                return await self._run(handle, scripts.archive(limit=self.snapshot_limit, workspace=self.workspace),
                                       stdout=queue.put, stderr=err.feed, what=f"snapshot (operation {operation_id})")
            finally:
                if not abandoned.is_set():  # else nobody reads: a full queue would hold this end marker for ever
                    await queue.put(None)

        producer = asyncio.ensure_future(produce())

        async def archive() -> AsyncIterator[bytes]:
            while (chunk := await queue.get()) is not None:
                budget.spend(len(chunk))  # past the limit: the upload is aborted, the exec cancelled
                yield chunk
            code = await producer  # the archive is only complete if tar said so: else the upload is aborted
            if code != 0:
                raise ProviderError(f"snapshot of {handle.id}: tar exited {code}: {err.text().strip()}")

        try:
            await store.put(name, archive(), metadata={"sandbox": handle.id.replace("/", "."),
                                                       "operation": tag_key(operation_id)})
        finally:
            abandoned.set()
            if not producer.done():
                producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await producer
        return name.id

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        store = self._store(Capability.RESTORE)
        name = SnapshotName.parse(snapshot_id)
        if name is None:
            raise SnapshotMissing(snapshot_id)
        size, data = await store.open(name)  # missing: raised before a Pod is made

        async def fill(handle: SandboxHandle) -> None:
            err = OutputBuffer(4096)
            # Never more than the limit into the Pod (checked below, before the Pod is made): the script reads
            # `size` bytes at most, and tar writes no more than it reads (a sparse file's holes are not written).
            code = await self._run(handle, scripts.extract(size, workspace=self.workspace), stderr=err.feed,
                                   data=data, what=f"restore snapshot {snapshot_id}")
            if code != 0:
                raise ProvisionError(f"restore of snapshot {snapshot_id} into {handle.id}: tar exited {code}: "
                                     f"{err.text().strip()}", retryable=True)

        try:
            if size > self.snapshot_limit:  # before any Pod is made
                raise ArchiveTooLarge(f"restore of snapshot {snapshot_id}", self.snapshot_limit, SNAPSHOT_LIMIT_SETTING)
            return await self._provision(spec, lease_seconds, restore=fill)
        finally:
            with contextlib.suppress(Exception):
                await data.aclose()

    async def copy_snapshot(self, snapshot_id: str, *, operation_id: str) -> str:
        store = self._store(Capability.SNAPSHOT_COPY)
        name = SnapshotName.parse(snapshot_id)
        if name is None:
            raise SnapshotMissing(snapshot_id)
        # The source's tags (installation, owner) kept, never retained: the copy is the fork's, deleted by it.
        copy = dataclasses.replace(name, retained=False, digest=hashlib.sha256(operation_id.encode()).hexdigest()[:40])
        await store.copy(name, copy)
        return copy.id

    async def delete_snapshot(self, snapshot_id: str) -> None:
        store = self._store(Capability.SNAPSHOT_DELETION)
        name = SnapshotName.parse(snapshot_id)
        if name is not None:  # anything else was never stored here: nothing to delete
            await store.delete(name)

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        if self.store is None:
            return []
        # Parts of takings that died mid-upload are no snapshot: the sweep that lists snapshots aborts them.
        await self.store.abort_stale_uploads(installation, older_than=STALE_UPLOAD_SECONDS)
        return await self.store.inventory(installation, provider=self.name)

