"""A session's sandboxes: made (or attached), renewed, destroyed, and the unrecorded ones a crash left reaped.

Order of effects: a sandbox is made only after the record that will name it is journaled ``started``, and journaled
``completed`` (named) right after it is made; ``provisioned:<op>`` is the fault point between the two, the window a
crash leaves an unrecorded sandbox that ``reap_unrecorded`` (and the orphan sweep) close."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from durable_sandbox.engine import faults
from durable_sandbox.engine.records import OperationRecord, OpKind
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.providers.contract import (
    RETAIN_LABEL,
    Capability,
    ConfigurationError,
    ProviderError,
    SandboxHandle,
    SandboxSpec,
)
from durable_sandbox.sandboxes import journal, retries
from durable_sandbox.sandboxes.call_records import handle_json
from durable_sandbox.sandboxes.errors import CleanupFailed
from durable_sandbox.sandboxes.scope import SessionScope
from durable_sandbox.sandboxes.services import SandboxServices
from durable_sandbox.sandboxes.state import Checkpoint

log = logging.getLogger("durable_sandbox.sandboxes")

T = TypeVar("T")


class Provisioner:
    def __init__(self, scope: SessionScope, spec: SandboxSpec, *, lease_seconds: int, attach: str | None) -> None:
        self.scope = scope
        self.spec = spec
        self.lease_seconds = lease_seconds
        # The name of a Sandbox resource whose live sandbox the session uses instead of provisioning one:
        # never destroyed, hibernated or recovered here (the Sandbox's controller owns its lifecycle).
        self.attach = attach

    async def transient(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` with the provider's transient errors retried (``retries.transient``)."""
        return await retries.transient(self.scope.sid, self.scope.provider.name, what, fn)

    # ------------------------------------------------------------------ making

    async def provision(self, prev: OperationRecord | None, options: dict[str, Any]) -> None:
        """The session's first sandbox (or its attached one), journaled ``<session>/provision``."""
        sc = self.scope
        op_id = journal.provision_id(sc.sid)
        if prev is not None:
            await self.reap_unrecorded()
        sc.rt.enter(op_id, OpKind.SANDBOX_PROVISION.value, sc.provider.name, None)
        meta = {"provider": sc.provider.name, "options": options}
        await sc.write(op_id, OpKind.SANDBOX_PROVISION, sc.provider.name, "started", meta=meta, check_cancel=True)
        if self.attach is not None:
            handle = await self._attached_handle(self.attach)
        else:
            spec = self.spec_for(op_id)
            handle = await self.transient(
                "provision", lambda: sc.provider.provision(spec, lease_seconds=self.lease_seconds))
            faults.reach(f"provisioned:{op_id}")  # made, not yet journaled: the crash window orphan sweeps close
        await sc.write(op_id, OpKind.SANDBOX_PROVISION, sc.provider.name, "completed", result=handle_json(handle), meta=meta)
        sc.state.handle, sc.state.newest = handle, handle.id
        sc.state.provider = sc.provider.name

    async def make(self, op_id: str, cp: Checkpoint | None) -> SandboxHandle:
        """A replacement for restore ``op_id``: from checkpoint ``cp``, or fresh when there is none."""
        provider, spec = self.scope.provider, self.spec_for(op_id)
        if cp is not None:
            handle: SandboxHandle = await self.transient(
                "restore", lambda: provider.restore(cp.snapshot_id, spec, lease_seconds=self.lease_seconds))
        else:
            handle = await self.transient("provision", lambda: provider.provision(spec, lease_seconds=self.lease_seconds))
        return handle

    def spec_for(self, op_id: str) -> SandboxSpec:
        """The spec for one provision/restore: its operation id lets a provider with an idempotent create
        answer the engine's retry of it with the same sandbox."""
        return self.spec.model_copy(update={"operation_id": f"{self.scope.rt.run_id}/{op_id}"})

    async def renewed(self, handle: SandboxHandle) -> SandboxHandle:
        """``handle``, its lease renewed when less than half of it is left."""
        if handle.lease_expires_at is not None and handle.lease_expires_at - time.time() < self.lease_seconds / 2:
            handle = await self.scope.provider.renew_lease(handle, self.lease_seconds)
            self.scope.state.handle = handle
        return handle

    # ------------------------------------------------------------------ attached (a Sandbox resource's sandbox)

    async def _attached_handle(self, name: str) -> SandboxHandle:
        """The live sandbox of Sandbox resource ``name`` (``SandboxServices.attached`` finds it)."""
        find = SandboxServices.of(self.scope.rt).attached
        if find is None:
            raise ConfigurationError(
                f"Sandbox {self.scope.sid!r}: sandboxRef {name!r} names a Sandbox resource, which only the operator "
                f"can attach; run this Workflow in a cluster, or give it spec.sandbox"
            )
        handle: SandboxHandle = await find(self.scope.rt.run_id, name)
        return handle

    def attached_name(self) -> str | None:
        """The Sandbox resource this session runs in (None: its own sandbox), as given or as journaled."""
        return self.attach or self.scope.state.options.get("attach")

    def attached_id(self) -> str | None:
        """The id of the attached Sandbox resource's sandbox (None for a session's own sandbox)."""
        if not self.attached_name():
            return None
        rec = self.scope.lookup(journal.provision_id(self.scope.sid))
        if rec is not None and rec.status == "completed" and isinstance(rec.result, dict):
            return rec.result.get("id")
        return None

    # ------------------------------------------------------------------ destroying

    async def destroy(self, handle: SandboxHandle, *, reason: str) -> None:
        sc = self.scope
        op_id = journal.destroy_id(sc.sid, handle.id)
        if sc.done(op_id):
            return
        meta: dict[str, Any] = {journal.META_SANDBOX_ID: handle.id, journal.META_REASON: reason}
        if handle.id == self.attached_id():
            # A Sandbox resource's sandbox is let go, not destroyed: it outlives the run.
            meta[journal.META_DETACHED] = True
            await sc.write(op_id, OpKind.SANDBOX_DESTROY, "detach", "completed", meta=meta)
            if sc.state.handle is not None and sc.state.handle.id == handle.id:
                sc.state.handle = None
            return
        await sc.write(op_id, OpKind.SANDBOX_DESTROY, "destroy", "started", meta=meta)
        await retries.cleanup(f"destroy sandbox {handle.id}", lambda: sc.provider.destroy(handle),
                              SandboxServices.of(sc.rt).cleanup_attempts)
        await sc.write(op_id, OpKind.SANDBOX_DESTROY, "destroy", "completed", meta=meta)
        sc.state.forget(handle.id)

    async def reap_unrecorded(self) -> None:
        """A crash between the provider creating a sandbox and the journal recording it would leak it:
        find such sandboxes by their labels and destroy them before making a new one. (A Sandbox resource's
        sandbox, attached, is never this session's to destroy.)"""
        sc = self.scope
        if self.attached_name():
            return
        if not sc.provider.capabilities().supports(Capability.LEASE_RECONCILIATION):
            return
        try:
            handles = await sc.provider.list_sandboxes(self.spec.owner or "")
        except ProviderError:
            return
        known = {h.id for h in sc.state.pending_handles} | ({sc.state.handle.id} if sc.state.handle else set())
        for h in handles:
            labels = h.metadata.get("labels") or {}
            ours = (labels.get("durable-sandbox.dev/run-id") == sc.rt.run_id
                    and labels.get("durable-sandbox.dev/session") == sc.sid)
            if ours and h.id not in known:
                try:
                    await retries.cleanup(f"destroy unrecorded sandbox {h.id}", functools.partial(sc.provider.destroy, h),
                                          SandboxServices.of(sc.rt).cleanup_attempts)
                except CleanupFailed as exc:  # not this run's failure: the orphan sweep removes it later
                    log.warning("run %s, session %s: %s", sc.rt.run_id, sc.sid, exc)


def sandbox_spec(rt: RunRuntime, sid: str, *, template: str | None = None, env: Mapping[str, str] | None = None,
                 owner: str | None = None, retain: bool = False) -> SandboxSpec:
    """What every sandbox of session ``sid`` is made with (a provision's or restore's op id is added per make)."""
    services = SandboxServices.of(rt)
    return SandboxSpec(
        template=template,
        env=dict(env or {}),
        owner=owner or (services.owner(rt.run_id) if services.owner is not None else None) or "durable-sandbox-local",
        labels={
            # The operator adds its installation label (orphan sweeps list by it); snapshots keep them.
            **services.labels,
            **({RETAIN_LABEL: "true"} if retain else {}),
            "durable-sandbox.dev/run-id": rt.run_id, "durable-sandbox.dev/session": sid,
        },
    )
