"""The Sandbox resources of a cluster, for session calls: found by name, their live sandbox taken by a session (hold.py).

A call takes the Sandbox's holder (``kube/holders/holding.py``, ``SESSION_CLAIM``) with the same compare-and-swap a Workflow
takes it with, so a call never shares the sandbox with a Workflow's calls or a suspend: a Sandbox held by a running
Workflow refuses the call (409, naming it); an idle-suspended one is resumed by the taking, and the call waits for
it to be Ready. What is acted on is the operator's sealed record of the Sandbox, never its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from durable_sandbox.kube.api.resources import SANDBOXES, WORKFLOWS, CustomObjects
from durable_sandbox.kube.holders.holding import SESSION_CLAIM, Holding, SandboxHeld
from durable_sandbox.kube.journal.sandbox_records import LINEAGE, SandboxRecords
from durable_sandbox.kube.sandbox.view import LOSS_REPORTED
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.fork_seed import SourceRef
from durable_sandbox.sessions.hold import LeftToAnotherReplica
from durable_sandbox.sessions.journal import SandboxRef

__all__ = ["KubeSandboxGate"]

READY_TIMEOUT = 120.0  # how long a call waits for a resuming Sandbox before it is refused (503: retry)
POLL = 0.5


class KubeSandboxGate:
    def __init__(self, objects: CustomObjects, records: SandboxRecords, holding: Holding,
                 provider_for_once: Callable[[str], AbstractAsyncContextManager[Any]],
                 *, namespaces: frozenset[str] = frozenset(), ready_timeout: float = READY_TIMEOUT) -> None:
        self.namespaces = namespaces  # the namespaces this operator serves (empty: all)
        self.objects = objects
        self.records = records
        self.holding = holding
        self.provider_for_once = provider_for_once
        self.ready_timeout = ready_timeout

    async def find(self, namespace: str, name: str) -> SandboxRef:
        if self.namespaces and namespace not in self.namespaces:
            raise CallRefused(404, "this operator does not serve the Sandbox's namespace", where=f"Sandbox {namespace}/{name}",
                              do=f"call the operator that serves namespace {namespace} (this one serves "
                              f"{', '.join(sorted(self.namespaces))})")
        body = await self.objects.get(SANDBOXES, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            raise CallRefused(404, "no such Sandbox" if body is None else "the Sandbox is being deleted",
                              where=f"Sandbox {namespace}/{name}",
                              do="create the Sandbox (kubectl apply) and wait for it to be Ready, or name another one")
        spec = body.get("spec") or {}
        every = spec.get("snapshotEveryNCalls")
        source = _source(spec.get("from"))
        if source is not None and source.workflow is not None:  # its uid as the API server has it now, here only
            found = await self.objects.get(WORKFLOWS, namespace, source.workflow)
            uid = ((found or {}).get("metadata") or {}).get("uid")
            source = dataclasses.replace(source, workflow_uid=str(uid) if uid else None)
        return SandboxRef(namespace, name, str(body["metadata"]["uid"]), snapshot_every=every if isinstance(every, int) else 0,
                          source=source)

    async def rewound(self, ref: SandboxRef, to_call: int, rewound: list[str]) -> None:
        """``status.lastRewind``, for `kubectl describe` (what the session's journal says, written by the operator)."""
        at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.objects.patch_status(SANDBOXES, ref.namespace, ref.name,
                                        {"lastRewind": {"toCall": to_call, "rewound": rewound, "at": at}})

    async def replaced(self, ref: SandboxRef, lost: str) -> SandboxHandle:
        """The live sandbox once the controller has replaced ``lost``; the call keeps holding the Sandbox meanwhile.
        ``status.lossReported`` wakes the controller to check it at once (else it would at its next renewal)."""
        await self.objects.patch_status(SANDBOXES, ref.namespace, ref.name, {LOSS_REPORTED: lost})
        return await self._wait_live(ref, lambda handle: f"sandbox {lost} is lost and not replaced yet"
                                     if handle.id == lost else None,
                                     late="the Sandbox's lost sandbox was not replaced in time")

    async def lineage(self, ref: SandboxRef) -> Mapping[str, str]:
        found = (await self.records.read(ref.namespace, ref.uid)).get(LINEAGE)
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    @contextlib.asynccontextmanager
    async def live(self, ref: SandboxRef) -> AsyncIterator[tuple[SandboxHandle, SandboxProvider]]:
        handle = await self._take(ref)
        release = True
        try:
            async with self.provider_for_once(handle.provider) as provider:
                yield handle, provider
        except LeftToAnotherReplica:
            release = False  # the replica holding the lease now holds the session's claim, and releases it
            raise
        finally:
            if release:
                await self.holding.release(ref.namespace, ref.name, SESSION_CLAIM)

    async def _take(self, ref: SandboxRef) -> SandboxHandle:
        await self._refuse_if_held(ref)
        try:
            return await self._wait_live(ref)
        except BaseException:
            # Taking an idle-suspended Sandbox holds it while it resumes: a call that gives up lets go of it.
            await self.holding.release(ref.namespace, ref.name, SESSION_CLAIM)
            raise

    async def _wait_live(self, ref: SandboxRef, unready: Callable[[SandboxHandle], str | None] = lambda _: None, *,
                         late: str = "the Sandbox has no live sandbox yet") -> SandboxHandle:
        """The Sandbox's live sandbox once ``unready`` finds nothing wrong with it (it answers why not, else None);
        each round refuses the call if the Sandbox is held or gone meanwhile, and past the ready timeout with 503
        (``late`` says what did not happen in time)."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                handle = await self.holding.live_handle(ref.namespace, ref.name, SESSION_CLAIM)
                why = unready(handle)
                if why is None:
                    return handle
            except SandboxHeld as waits:
                why = str(waits)
            await self._refuse_if_held(ref)
            if time.monotonic() > deadline:
                raise CallRefused(503, f"{late}: {why}", where=ref.where,
                                  do="retry the call with the same operationId; `kubectl describe dsbx` says what it "
                                  "waits for")
            await asyncio.sleep(POLL)

    async def _refuse_if_held(self, ref: SandboxRef) -> None:
        """409 while a running Workflow holds the Sandbox or spec.suspend keeps it suspended (404 if it was
        re-created: another uid)."""
        body = await self.objects.get(SANDBOXES, ref.namespace, ref.name)
        if body is None or body["metadata"]["uid"] != ref.uid:
            raise CallRefused(404, "the Sandbox was deleted (or re-created) while the call waited", where=ref.where,
                              do="send the call again to the Sandbox as it is now")
        if (body.get("spec") or {}).get("suspend"):
            raise CallRefused(409, "the Sandbox is suspended on request (spec.suspend: true)", where=f"{ref.where}, "
                              "spec.suspend", do="set spec.suspend to false (kubectl patch dsbx ... --type=merge -p "
                              "'{\"spec\":{\"suspend\":false}}'), then retry with the same operationId")
        holder = await self.holding.running_holder(ref.namespace, await self.records.read(ref.namespace, ref.uid))
        if holder is not None and holder != SESSION_CLAIM:
            raise CallRefused(409, f"the Sandbox is held by Workflow {holder!r} (spec.sandboxRef): one holder at a "
                              "time runs calls in it", where=ref.where,
                              do=f"retry with the same operationId once Workflow {holder} has finished or is cancelled")


def _source(found: Any) -> SourceRef | None:
    """``spec.from`` (the API server validated it against the CRD: one of sandbox or workflow, afterCall >= 0)."""
    if not isinstance(found, dict):
        return None
    sandbox, workflow = found.get("sandbox"), found.get("workflow")
    return SourceRef(sandbox if isinstance(sandbox, str) else None, workflow if isinstance(workflow, str) else None,
                     int(found.get("afterCall") or 0))
