"""Intent, then effect: every provider side effect of a Sandbox is preceded by a record of its operation (kind and a
stable id), so a restart finishes it: a provision or restore adopts what the interrupted one made (the provider's
own sealed sandboxes only) or makes it, a snapshot is taken again under the same id, a destroy is repeated."""

from __future__ import annotations

import logging
import time
from typing import Any

from durable_sandbox.engine import faults
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.api.objects import owner_tag
from durable_sandbox.kube.api.resources import SANDBOXES, WORKFLOWS
from durable_sandbox.kube.journal.sandbox_records import ACTIVE_AT, LINEAGE, SNAPSHOT_AT
from durable_sandbox.kube.sandbox.base import handle_metadata
from durable_sandbox.kube.sandbox.checkpoints import session_points, with_lineage
from durable_sandbox.kube.sandbox.lease import SandboxLease
from durable_sandbox.kube.sandbox.view import (
    OPERATION_LABEL,
    SANDBOX_LABEL,
    SandboxView,
)
from durable_sandbox.kube.spec.conditions import State, rfc3339
from durable_sandbox.kube.spec.models import SandboxResource
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    Capability,
    ProvisionError,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    tag_key,
)
from durable_sandbox.workflows.sandbox_agent import resolve_env

log = logging.getLogger("durable_sandbox.kube.sandbox.controller")

__all__ = ["SandboxOperations", "SnapshotRefused"]


class SnapshotRefused(ProvisionError):
    """``spec.fromSnapshot`` names a snapshot this namespace may not restore."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class SandboxOperations(SandboxLease):
    """Recorded operations: begin, finish, provision, adopt, and superseded snapshots."""

    async def _begin(self, view: SandboxView, kind: str, phase: str, *, snapshot_id: str | None = None,
                     **states: State) -> None:
        count = int(view.status.get("operationCount") or 0) + 1
        op: dict[str, Any] = {"id": f"dsbx-{view.uid[:8]}-{count}-{kind}", "kind": kind}
        if snapshot_id is not None:
            op["snapshotId"] = snapshot_id
        await self._transition(view, phase, {"operation": op, "operationCount": count}, **states)

    async def _finish_operation(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> None:
        """Finish the operation recorded before a crash (or a provider error), with its operation id."""
        op = view.status.get("operation")
        if not op:
            await self._delete_superseded(view, provider)
            return
        kind = op["kind"]
        if kind in ("provision", "restore"):
            await self._run_provision(view, res, provider)
        elif kind == "snapshot":
            handle = view.handle()
            assert handle is not None
            snapshot_id = await provider.snapshot(handle, operation_id=op["id"])
            faults.reach("inside:sandbox.suspend")  # taken, not yet recorded: the crash window
            # What it was taken of (the session calls it holds are those that sandbox held) and when (a loss
            # restores the newest snapshot, this or one the session calls took), before it is listed.
            await self._record(view, {LINEAGE: with_lineage(view.status.get(LINEAGE), snapshot_id, handle.id),
                                      SNAPSHOT_AT: time.time()})
            # Record the new snapshot (the old ones stay listed until the new one is recorded).
            snapshots = [s for s in view.snapshots if s != snapshot_id] + [snapshot_id]
            await self._patch(view, {"snapshots": snapshots,
                                     "operation": {"id": op["id"], "kind": "destroy", "snapshotId": snapshot_id}})
            await self._emit(view, "SnapshotTaken", f"snapshot {snapshot_id} of sandbox {handle.id} taken")
            await self._finish_operation(view, res, provider)
            return
        elif kind == "destroy":
            handle = view.handle()
            if handle is not None:
                await provider.destroy(handle)
            await self._patch(view, {"providerId": None, "handle": None, "leaseExpiresAt": None, "operation": None})
        await self._delete_superseded(view, provider)

    async def _delete_superseded(self, view: SandboxView, provider: SandboxProvider) -> None:
        """Every owned snapshot but the newest (the newest is recorded, so they are superseded)."""
        snapshots = view.snapshots
        for old in snapshots[:-1]:
            await provider.delete_snapshot(old)
            remaining = [s for s in view.snapshots if s != old]
            await self._patch(view, {"snapshots": remaining})
            await self._emit(view, "SnapshotDeleted", f"snapshot {old} deleted (superseded by {snapshots[-1]})")

    async def _bring_up(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider, *, reason: str) -> None:
        """Provision, or restore the newest owned snapshot (else ``spec.fromSnapshot`` on first creation)."""
        source = await self._newest_snapshot(view)
        if source is None and reason == "create" and not view.status.get("operationCount") and res.spec.from_snapshot:
            source = res.spec.from_snapshot
            await self._check_from_snapshot(view, provider, source)
        phase = {"create": "Provisioning", "resume": "Resuming", "recover": "Recovering"}[reason]
        kind = "restore" if source is not None else "provision"
        await self._begin(view, kind, phase, snapshot_id=source,
                          Ready=(False, phase, f"{kind} of a sandbox" + (f" from snapshot {source}" if source else "")))
        await self._run_provision(view, res, provider)

    async def _newest_snapshot(self, view: SandboxView) -> str | None:
        """The newest snapshot holding this Sandbox's workspace: its own newest (a suspend's) or the newest its
        session calls took (``spec.snapshotEveryNCalls``), whichever was taken last."""
        session, rewound_at, stale = await session_points(self.journals, view.namespace, view.uid)
        own_at = float(view.status.get(SNAPSHOT_AT) or 0)
        own = view.snapshots[-1] if view.snapshots else None
        # Its own snapshot taken before the session was rewound, or of a sandbox holding rewound calls (one not yet
        # replaced when it was suspended), holds rewound calls (sessions/rewind.py): never restored.
        if own is not None and (own_at <= rewound_at or (view.status.get(LINEAGE) or {}).get(own) in stale):
            own = None
        if session and (own is None or session[-1].taken_at > own_at):
            return session[-1].snapshot_id
        return own

    async def _check_from_snapshot(self, view: SandboxView, provider: SandboxProvider, snapshot_id: str) -> None:
        """``spec.fromSnapshot`` names a snapshot this namespace owns: one the provider took of a sandbox of this
        installation whose owner is a Workflow or a Sandbox of this namespace (the owner tag it recorded, never
        anything a user can write). Snapshot ids are printed in status, Events and logs; knowing another
        tenant's must not let anyone read its files. :class:`SnapshotRefused` otherwise."""
        where = f"spec.fromSnapshot: snapshot {snapshot_id}"
        if not provider.capabilities().supports(Capability.INVENTORY):
            raise SnapshotRefused(f"{where}: provider {provider.name} cannot tell whose snapshot it is, so it is not "
                                  f"restored; restore only with a provider that keeps owner tags (inventory)")
        installation = self.labels.get(INSTALLATION_LABEL, "")
        entry = next((e for e in await provider.inventory_snapshots(installation) if e.id == snapshot_id), None)
        if entry is None:
            raise SnapshotRefused(f"{where} is not one this operator took (or it was deleted); name a snapshot of a "
                                  f"Workflow (retainLatestSnapshot) or a Sandbox of this namespace")
        owners = {tag_key(owner_tag(view.namespace, obj["metadata"]["uid"]))
                  for plural in (WORKFLOWS, SANDBOXES) for obj in await self.objects.list(plural, view.namespace)}
        if entry.owner_key not in owners:
            raise SnapshotRefused(f"{where} does not belong to this namespace: only snapshots of this namespace's own "
                                  f"Workflows and Sandboxes can be restored here")

    async def _run_provision(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> None:
        op = view.status["operation"]
        spec = SandboxSpec(
            template=res.spec.template,
            env=resolve_env(res.spec, await self._secrets(view, res)),
            owner=view.owner,
            labels={**self.labels, SANDBOX_LABEL: label_value(view.name), OPERATION_LABEL: op["id"]},
            operation_id=op["id"],
        )
        adopted = await self._adopt(view, provider, op["id"])
        if adopted is not None:
            handle = adopted
        elif op["kind"] == "restore":
            handle = await provider.restore(op["snapshotId"], spec, lease_seconds=res.spec.lease_seconds)
        else:
            handle = await provider.provision(spec, lease_seconds=res.spec.lease_seconds)
        faults.reach(f"inside:sandbox.{op['kind']}")  # made, not yet recorded: the crash window
        # Where it came from, before it is recorded live: a session call meeting it first knows which of its calls
        # it holds (the snapshot's, or none when made fresh). A restart adopts the same sandbox and writes it again.
        await self._record(view, {LINEAGE: with_lineage(view.status.get(LINEAGE), handle.id,
                                                        op.get("snapshotId") or "")})
        await self._patch(view, {"providerId": handle.id, "handle": handle_metadata(handle),
                                 "leaseExpiresAt": rfc3339(handle.lease_expires_at), "operation": None})
        # A sandbox made live starts its idle time now (kept out of view.status: Holding writes it too).
        await self.records.write(view.namespace, view.name, view.uid, {ACTIVE_AT: time.time()})
        source = f" from snapshot {op['snapshotId']}" if op.get("snapshotId") else ""
        await self._emit(view, "Provisioned", f"sandbox {handle.id} provisioned{source}")

    async def _adopt(self, view: SandboxView, provider: SandboxProvider, op_id: str) -> SandboxHandle | None:
        """The sandbox an interrupted provision/restore already made (found by owner tag and operation
        label); every other sandbox this Sandbox owns and has not recorded is destroyed."""
        if not provider.capabilities().supports(Capability.LEASE_RECONCILIATION):
            return None
        found = await provider.list_sandboxes(view.owner)
        keep = next((h for h in found if (h.metadata.get("labels") or {}).get(OPERATION_LABEL) == op_id), None)
        for handle in found:
            if handle is not keep and handle.id != view.status.get("providerId"):
                log.info("sandbox %s/%s: destroying unrecorded sandbox %s", view.namespace, view.name, handle.id)
                await provider.destroy(handle)
        return keep
