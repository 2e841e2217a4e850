"""Reconciliation of ``Sandbox`` resources, without kopf: one long-lived provider sandbox per object.

kopf (``kube/handlers.py``) calls :meth:`SandboxController.daemon` once per Sandbox (it keeps the
sandbox as the spec asks for as long as the object exists), :meth:`notice` on every watch event and
:meth:`cleanup` from the delete handler behind the ``durable-sandbox.dev/cleanup`` finalizer.

What the daemon keeps true:
- ``spec.suspend: false``: one live provider sandbox, recorded in ``status.providerId``/``handle``,
  provisioned fresh, restored from ``spec.fromSnapshot`` at first, or restored from the newest owned
  snapshot; its provider lease renewed at half its length. A sandbox the provider reports gone is a
  loss: ``SandboxLost`` Event, ``Ready=False``, then re-created from the newest snapshot (``Recovered``).
- ``spec.suspend: true``: snapshot, record it in ``status.snapshots``, destroy the live sandbox; a
  provider without the snapshot capability refuses with ``Suspended=False`` (reason SnapshotUnsupported).
  A superseded snapshot is deleted only after the new one is recorded.
- ``spec.idleSuspendAfterSeconds``: a live sandbox nobody has held for that long (``kube/sandbox/idle.py``
  plans it from the record's ``lastActiveAt``) is suspended the same way, under the holder ``IDLE_CLAIM``
  (``kube/holding.py``), so no Workflow's call runs while it is half suspended; it stays suspended until a
  Workflow takes it, which resumes it from the snapshot (``IdleSuspended``, ``Resumed`` Events). The
  explicit ``spec.suspend`` wins over it either way.

What the controller acts on (the live sandbox's id and handle, the snapshots it owns, the operation in
progress, its phase) is kept in the Sandbox's own record (``kube/sandbox_records.py``: a sealed Journal object
no namespace role grants) and shown in status; status is never read back as truth (anyone granted
``sandboxes/status`` can write it), so nobody but the operator can point a Sandbox at another tenant's sandbox
or snapshot.

Crash safety: every provider side effect is preceded by a record of its intent (``operation``: kind and a
stable operation id). A restart finishes the recorded operation: a
provision or restore looks for the sandbox by owner tag and operation label first (and destroys any
other sandbox this Sandbox owns), a snapshot is taken again under the same operation id (reconciling
providers return the same snapshot), a destroy is repeated (idempotent). So a SIGKILL anywhere leaves
exactly one live sandbox, or exactly one snapshot, after the restart.

Status is written only here, through the status subresource (merge patches), one write per transition, right
after the record.

One replica at a time: every replica runs a daemon for every Sandbox, but only the holder of the
Sandbox's ``coordination.k8s.io`` Lease (``dsbx.<uid>``, owned by the Sandbox, see ``kube/leases.py``)
reconciles it and runs its cleanup; the others look again when the holder's lease would run out, so a
dead holder is taken over after about one lease period, and one that stops (SIGTERM) releases it. A
holder that loses its lease (not renewed in time, taken over) stops the reconciliation in progress at
once; the operation recorded in status makes that as safe as a crash. A new holder reads the status
back from the API server before it acts (the previous holder wrote it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from durable_sandbox.engine import faults
from durable_sandbox.kube.client import KubeClient
from durable_sandbox.kube.conditions import SANDBOX_CONDITIONS, State, find, merge, rfc3339
from durable_sandbox.kube.errors import CleanupPending
from durable_sandbox.kube.events import EventRecorder, LifecycleEvent
from durable_sandbox.kube.holding import Holding
from durable_sandbox.kube.labels import label_value
from durable_sandbox.kube.leases import HeldLease, LeaseBusy, ObjectLeases
from durable_sandbox.kube.models import SandboxResource
from durable_sandbox.kube.objects import owner_tag
from durable_sandbox.kube.oplog import LIFECYCLE_LOGGER, about
from durable_sandbox.kube.provider_choice import PINNED, refusal, sandbox_choice
from durable_sandbox.kube.resources import (
    API_VERSION,
    OPERATOR_FIELD_MANAGER,
    SANDBOXES,
    WORKFLOWS,
    CustomObjects,
)
from durable_sandbox.kube.sandbox.idle import SUSPENDED, IdlePlan, plan_idle
from durable_sandbox.kube.sandbox.view import (
    OPERATION_LABEL,
    SANDBOX_LABEL,
    SandboxControllerSettings,
    SandboxView,
)
from durable_sandbox.kube.sandbox_records import (
    ACTIVE_AT,
    HOLDER,
    IDLE_CLAIM,
    IDLE_SUSPENDED,
    RECORDED,
    SUSPENDED_AT,
    SandboxRecords,
)
from durable_sandbox.kube.secrets import read_secret_values, secret_refs
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    Capability,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    UnsupportedCapability,
    tag_key,
)
from durable_sandbox.workflows.sandbox_agent import resolve_env

log = logging.getLogger(__name__)
lifecycle = logging.getLogger(LIFECYCLE_LOGGER)
# The Events that are steps of a Sandbox's life: each is also a line of the lifecycle log (INFO, as a run's are).
STEPS = frozenset({"Provisioned", "SnapshotTaken", "SnapshotDeleted", "SandboxLost", "Recovered", "IdleSuspended",
                   "Resumed", "CleanupDone"})



CONDITION_ORDER = SANDBOX_CONDITIONS


class SnapshotRefused(ProvisionError):
    """``spec.fromSnapshot`` names a snapshot this namespace may not restore."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class SandboxController:
    def __init__(
        self,
        api: KubeClient,
        events: EventRecorder,
        provider: Callable[[str], SandboxProvider],
        settings: SandboxControllerSettings | None = None,
        labels: Mapping[str, str] | None = None,
        *,
        records: SandboxRecords,
        holding: Holding,
    ) -> None:
        self.api = api
        self.records = records
        self.holding = holding
        self.objects = CustomObjects(api)
        self.events = events
        self.labels = dict(labels or {})  # on every sandbox provisioned (the installation label: orphan sweeps)
        self._provider_of = provider
        self._providers: dict[str, SandboxProvider] = {}
        self.settings = settings or SandboxControllerSettings()
        self._views: dict[str, SandboxView] = {}  # uid -> view
        self._leases = ObjectLeases(api, field_manager=OPERATOR_FIELD_MANAGER, api_version=API_VERSION, kind="Sandbox",
                                    prefix="dsbx", name_label=SANDBOX_LABEL)

    def provider(self, name: str) -> SandboxProvider:
        found = self._providers.get(name)
        if found is None:
            found = self._providers[name] = self._provider_of(name)
        return found

    # ------------------------------------------------------------------ status and events

    async def _patch(self, view: SandboxView, changes: dict[str, Any]) -> None:
        """Record ``changes`` (None deletes) that the controller acts on in the Sandbox's record, then show them
        all in status (merge patch), and keep them as what we know."""
        changes = {**changes, "observedGeneration": view.generation}
        await self._record(view, changes)  # (the record keeps only its own fields of them)
        await self.objects.patch_status(SANDBOXES, view.namespace, view.name, changes)

    @staticmethod
    def _conditions(view: SandboxView, **states: State) -> list[dict[str, Any]]:
        """The conditions with ``states`` (type -> (on, reason, message)) applied over the current ones."""
        return merge(view.status.get("conditions") or [], states, view.generation, CONDITION_ORDER)

    async def _transition(self, view: SandboxView, phase: str, changes: dict[str, Any] | None = None,
                          **states: State) -> None:
        await self._patch(view, {**(changes or {}), "phase": phase, "conditions": self._conditions(view, **states)})

    async def _emit(self, view: SandboxView, reason: str, message: str, kind: str = "Normal") -> None:
        if reason in STEPS:
            lifecycle.info("%s/%s (Sandbox): %s: %s", view.namespace, view.name, reason, message,
                           extra=about(view.namespace))
        await self.events.emit(dict(view.latest()), LifecycleEvent(reason, message[:1024], kind))

    async def _record(self, view: SandboxView, changes: dict[str, Any]) -> None:
        """Record ``changes`` that the controller acts on (None deletes) and keep them as what we know; status
        shows only what :meth:`_patch` writes."""
        for key, value in changes.items():
            if value is None:
                view.status.pop(key, None)
            else:
                view.status[key] = value
        await self.records.write(view.namespace, view.name, view.uid, changes)

    async def _show_state(self, view: SandboxView, plan: IdlePlan) -> None:
        """``status.state`` and ``status.stateSince`` (the State and Since columns), written when they change."""
        shown = {"state": plan.state, "stateSince": rfc3339(plan.since)}
        if any(view.status.get(key) != value for key, value in shown.items()):
            await self._patch(view, shown)

    # ------------------------------------------------------------------ the daemon

    def notice(self, body: Mapping[str, Any]) -> None:
        view = self._views.get(body.get("metadata", {}).get("uid", ""))
        if view is not None:
            view.notice(body)

    async def daemon(self, body_of: Callable[[], Mapping[str, Any]], stopped: asyncio.Event) -> None:
        """Keep one Sandbox as its spec asks until it is deleted or this process stops (while this replica
        holds its Lease; otherwise wait for the holder's lease to run out)."""
        view = self._view(body_of(), body_of)
        try:
            while not stopped.is_set() and not view.deleting:
                view.wake.clear()
                async with view.lock:
                    if view.deleting:
                        return
                    busy = await self._hold(view)
                    delay = busy if busy is not None else await self._reconcile(view)
                await view.wait(stopped, delay)
        finally:
            held = view.lease is not None and view.lease.held
            if not (view.deleting and held):  # a deleted Sandbox's lease (and view) is this replica's cleanup's
                self._views.pop(view.uid, None)
            if not view.deleting and held:
                assert view.lease is not None
                with contextlib.suppress(Exception):
                    await view.lease.release()  # hand it over at once (SIGTERM, rolling update)

    def _view(self, body: Mapping[str, Any], body_of: Callable[[], Mapping[str, Any]] | None = None) -> SandboxView:
        meta = body["metadata"]
        view = self._views.get(meta["uid"])
        if view is None:
            view = SandboxView(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], body=body,
                               status=_shown(body.get("status")))
            self._views[view.uid] = view
        view.body = body
        if body_of is not None:
            view.body_of = body_of
        return view

    # ------------------------------------------------------------------ the Sandbox's Lease (one replica reconciles)

    def _lease_of(self, view: SandboxView) -> HeldLease:
        if view.lease is None:
            view.lease = self._leases.lease(view.namespace, view.name, view.uid, holder=self.settings.worker_id,
                                            ttl=self.settings.lease_ttl, on_lost=lambda: self._lease_lost(view))
        return view.lease

    async def _hold(self, view: SandboxView) -> float | None:
        """None when this replica holds the Sandbox's Lease; else how long until the holder's runs out."""
        lease = self._lease_of(view)
        if lease.held:
            return None
        try:
            epoch = await lease.take()
        except LeaseBusy as busy:
            if view.waiting_on != busy.holder:
                view.waiting_on = busy.holder
                log.info("sandbox %s/%s is reconciled by replica %s; this one waits", view.namespace, view.name,
                         busy.holder)
            return max(1.0, busy.remaining + 0.5)
        view.waiting_on = None
        log.info("sandbox %s/%s: this replica (%s) reconciles it now (lease epoch %d)", view.namespace, view.name,
                 self.settings.worker_id, epoch)
        # The previous holder wrote last: start from what the API server has, not from our memory; what is acted
        # on from the Sandbox's record, only the conditions (for their transition times) from its status.
        obj = await self.objects.get(SANDBOXES, view.namespace, view.name)
        if obj is not None:
            view.status = {**_shown(obj.get("status")), **await self.records.read(view.namespace, view.uid)}
        return None

    def _lease_lost(self, view: SandboxView) -> None:
        """Another replica may act from now on: stop what this one is doing (as safe as a crash)."""
        if view.turn is not None and not view.turn.done():
            view.turn.cancel()
        view.wake.set()

    async def _reconcile(self, view: SandboxView) -> float | None:
        """One turn, stopped if the lease is lost meanwhile (then look again shortly)."""
        view.turn = asyncio.ensure_future(self._turn(view))
        try:
            return await asyncio.shield(view.turn)
        except asyncio.CancelledError:
            if not view.turn.cancelled():
                view.turn.cancel()  # this daemon itself is being cancelled: stop the turn too
                raise
            log.warning("sandbox %s/%s: the lease was lost during a reconciliation; stopped it", view.namespace, view.name)
            return 0.0
        finally:
            view.turn = None

    async def _turn(self, view: SandboxView) -> float | None:
        """One reconciliation; returns how long until the next one is due (None: on the next spec change)."""
        body = view.latest()
        view.generation = body.get("metadata", {}).get("generation")
        try:
            res = SandboxResource.model_validate(dict(body))
        except ValidationError as exc:
            err = exc.errors()[0]
            message = f"spec: {'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            await self._transition(view, "Failed", Ready=(False, "InvalidSpec", message))
            await self._emit(view, "InvalidSpec", message, "Warning")
            return None
        choice = sandbox_choice(view.status, res.spec.provider, self.settings.default_provider)
        refused = refusal(choice, where="spec.provider", allow_local=self.settings.allow_local_provider)
        if refused is not None:
            await self._transition(view, "Failed", Ready=(False, *refused))
            await self._emit(view, refused[0], refused[1], "Warning")
            return None
        try:
            provider = self.provider(choice.name)
        except Exception as exc:
            message = f"spec.provider: {exc}"
            await self._transition(view, "Failed", Ready=(False, "ProviderNotAllowed", message))
            await self._emit(view, "ProviderNotAllowed", message, "Warning")
            return None
        if choice.source != "pinned":
            # Before anything is made: what this Sandbox makes from now on, and cleans up at the end, is made with
            # this provider, whatever a later --default-provider (or a changed spec.provider) says.
            await self._patch(view, {PINNED: choice.name})
        elif res.spec.provider and res.spec.provider != choice.name:
            message = (f"spec.provider is {res.spec.provider!r}, but this Sandbox's sandboxes are {choice.name}'s (fixed "
                       f"when it was first reconciled); it stays on {choice.name}: create a new Sandbox for another provider")
            log.warning("sandbox %s/%s: %s", view.namespace, view.name, message)
            await self._emit(view, "ProviderFixed", message, "Warning")
        res = res.model_copy(update={"spec": res.spec.model_copy(update={"provider": choice.name})})
        if view.status.get("capabilities") is None:
            caps = provider.capabilities()
            await self._patch(view, {"capabilities": {
                "supported": sorted(c.value for c in caps.supported),
                "deliveryGuarantee": caps.delivery_guarantee,
                "maximumLeaseSeconds": caps.maximum_lease_seconds,
                "toolTypes": list(caps.tool_types),
            }})
        try:
            await self._finish_operation(view, res, provider)
            if res.spec.suspend:
                await self._drop_idle_claim(view)
                return await self._keep_suspended(view, res, provider)
            return await self._keep_available(view, res, provider)
        except LookupError as exc:  # a Secret named by spec.env is missing
            await self._transition(view, "Pending", Ready=(False, "SecretMissing", str(exc)))
            return self.settings.failed_retry
        except SnapshotRefused as exc:
            await self._transition(view, "Failed", Ready=(False, "SnapshotNotOwned", str(exc)))
            await self._emit(view, "SnapshotNotOwned", str(exc), "Warning")
            return None  # final until the spec changes
        except ProvisionError as exc:
            if exc.retryable:
                log.warning("sandbox %s/%s: %s", view.namespace, view.name, exc)
                return self.settings.retry
            await self._transition(view, "Failed", Ready=(False, "ProvisionFailed", str(exc)))
            await self._emit(view, "ProvisionFailed", str(exc), "Warning")
            return self.settings.failed_retry
        except (ProviderError, OSError) as exc:
            # Transient: the recorded operation (if any) is finished on the next turn, same operation id.
            log.warning("sandbox %s/%s: provider error, retrying: %s: %s", view.namespace, view.name, type(exc).__name__, exc)
            return self.settings.retry

    # ------------------------------------------------------------------ live

    async def _keep_live(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        handle = view.handle()
        if handle is None:
            await self._bring_up(view, res, provider, reason="resume" if view.snapshots else "create")
            handle = view.handle()
            assert handle is not None
        lease = res.spec.lease_seconds
        expires = handle.lease_expires_at or _parse_time(view.status.get("leaseExpiresAt"))
        now = time.time()
        if expires is None or expires - now <= lease / 2:
            try:
                handle = await provider.renew_lease(handle, lease)
            except SandboxGone as exc:
                return await self._lost(view, res, provider, str(exc))
            await self._patch(view, {"leaseExpiresAt": rfc3339(handle.lease_expires_at),
                                     "handle": _metadata(handle)})
            expires = handle.lease_expires_at
        if view.status.get("phase") != "Ready":
            await self._transition(view, "Ready", Ready=(True, "SandboxReady", f"sandbox {handle.id} is live"),
                                   Suspended=(False, "NotSuspended", ""))
        # Renew at half the lease; look again at least that often (renewal is the liveness check).
        due = (expires - lease / 2 - time.time()) if expires is not None else lease / 2
        return max(1.0, min(due, lease / 2))

    async def _bring_up(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider, *, reason: str) -> None:
        """Provision, or restore the newest owned snapshot (else ``spec.fromSnapshot`` on first creation)."""
        source = view.snapshots[-1] if view.snapshots else None
        if source is None and reason == "create" and not view.status.get("operationCount") and res.spec.from_snapshot:
            source = res.spec.from_snapshot
            await self._check_from_snapshot(view, provider, source)
        phase = {"create": "Provisioning", "resume": "Resuming", "recover": "Recovering"}[reason]
        kind = "restore" if source is not None else "provision"
        await self._begin(view, kind, phase, snapshot_id=source,
                          Ready=(False, phase, f"{kind} of a sandbox" + (f" from snapshot {source}" if source else "")))
        await self._run_provision(view, res, provider)

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
        await self._patch(view, {"providerId": handle.id, "handle": _metadata(handle),
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

    async def _lost(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider, detail: str) -> float:
        lost = view.status.get("providerId")
        message = f"sandbox {lost} is gone ({detail}); re-creating it" + (
            f" from snapshot {view.snapshots[-1]}" if view.snapshots else " fresh (no snapshot to restore)")
        await self._transition(view, "Recovering", {"providerId": None, "handle": None, "leaseExpiresAt": None},
                               Ready=(False, "SandboxLost", message))
        await self._emit(view, "SandboxLost", message, "Warning")
        await self._bring_up(view, res, provider, reason="recover")
        handle = view.handle()
        assert handle is not None
        source = f"snapshot {view.snapshots[-1]}" if view.snapshots else "a fresh sandbox"
        await self._emit(view, "Recovered", f"sandbox {lost} recovered into {handle.id} from {source}")
        await self._transition(view, "Ready", Ready=(True, "Recovered", f"sandbox {handle.id} is live (recovered)"))
        return 1.0

    # ------------------------------------------------------------------ idle (spec.idleSuspendAfterSeconds)

    async def _keep_available(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        """``spec.suspend: false``: live, unless the idle timer suspended it and no Workflow has taken it since."""
        record = await self.records.read(view.namespace, view.uid)
        if record.get(HOLDER) == IDLE_CLAIM:
            return await self._idle_suspend(view, res, provider)  # ours, interrupted (a crash, a lost lease)
        if view.status.get(IDLE_SUSPENDED):
            holder = await self.holding.running_holder(view.namespace, record)
            if view.handle() is None and holder is None and res.spec.idle_suspend_after_seconds is not None:
                # Woken when a Workflow takes it (status.holder changes, see SandboxView.notice) or the spec changes.
                return await self._stay_idle_suspended(view, res)
            delay = await self._keep_live(view, res, provider)  # restores the newest snapshot
            await self._resumed(view, holder)
        else:
            delay = await self._keep_live(view, res, provider)
        return await self._idle_timer(view, res, provider, delay)

    async def _idle_timer(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider,
                          delay: float | None) -> float | None:
        """Show the state; suspend the live sandbox if nobody has held it for ``idleSuspendAfterSeconds``."""
        if view.handle() is None:
            return delay
        record = await self.records.read(view.namespace, view.uid)
        last_active = record.get(ACTIVE_AT)
        if not isinstance(last_active, int | float):  # recorded before idle timers existed: it starts now
            last_active = time.time()
            await self.records.write(view.namespace, view.name, view.uid, {ACTIVE_AT: last_active})
        held = await self.holding.running_holder(view.namespace, record) is not None
        after = res.spec.idle_suspend_after_seconds
        plan = plan_idle(after=after, live=True, held=held, last_active=last_active, suspended_at=None, now=time.time())
        await self._show_state(view, plan)
        if not plan.suspend:
            due = None if plan.due_in is None else max(plan.due_in, 0.1)
            return due if delay is None else delay if due is None else min(delay, due)
        if not provider.capabilities().supports(Capability.SNAPSHOT):
            message = (f"provider {res.spec.provider} cannot snapshot, so spec.idleSuspendAfterSeconds cannot suspend "
                       f"it without losing the workspace; the sandbox stays live")
            if (self._condition(view, "Suspended") or {}).get("reason") != "SnapshotUnsupported":
                await self._transition(view, "Ready", Suspended=(False, "SnapshotUnsupported", message))
                await self._emit(view, "SuspendRefused", message, "Warning")
            return delay
        await faults.pause("idle:due")  # the race tests stop here: due, not yet claimed
        # The same compare-and-swap a Workflow takes the Sandbox with, and only if nobody took or let go of it
        # since it was read: either a Workflow's calls or this suspend, never both.
        if not await self.records.swap_holder(view.namespace, view.uid, record.get(HOLDER), IDLE_CLAIM,
                                              unchanged={ACTIVE_AT: record.get(ACTIVE_AT)}):
            log.info("sandbox %s/%s: the idle timer was due, but a Workflow took or let go of the Sandbox meanwhile; "
                     "not suspended", view.namespace, view.name)
            return 0.0  # plan again from the record as it is now
        return await self._idle_suspend(view, res, provider)

    async def _idle_suspend(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        """Holding ``IDLE_CLAIM``: snapshot and destroy the live sandbox, record that it is idle-suspended, let go
        (from then on a Workflow may take it, which resumes it)."""
        after = res.spec.idle_suspend_after_seconds
        if view.handle() is not None:
            await self._begin(view, "snapshot", "Suspending",
                              Ready=(False, "Suspending", f"{_idle_for(after)}; taking a snapshot to suspend"))
            await faults.pause("idle:claimed")  # the race tests stop here: claimed, the sandbox still live
            await self._finish_operation(view, res, provider)
        if not view.status.get(IDLE_SUSPENDED):
            await self._record(view, {IDLE_SUSPENDED: True, SUSPENDED_AT: time.time()})
        # Let go before saying so: a Workflow waiting for this Sandbox looks again on its status change.
        if not await self.records.swap_holder(view.namespace, view.uid, IDLE_CLAIM, None):
            log.warning("sandbox %s/%s: the idle suspend's claim was gone when it was let go", view.namespace, view.name)
        return await self._stay_idle_suspended(view, res)

    async def _stay_idle_suspended(self, view: SandboxView, res: SandboxResource) -> float:
        suspended_at = view.status.get(SUSPENDED_AT)
        since = float(suspended_at) if isinstance(suspended_at, int | float) else None
        if view.status.get("phase") != "Suspended":
            latest = view.snapshots[-1] if view.snapshots else None
            message = (f"{_idle_for(res.spec.idle_suspend_after_seconds)}: suspended in snapshot {latest}; the next "
                       f"Workflow that uses it (spec.sandboxRef) resumes it")
            await self._transition(view, "Suspended", {"state": SUSPENDED, "stateSince": rfc3339(since)},
                                   Ready=(False, "IdleSuspended", message), Suspended=(True, "IdleTimeout", message))
            await self._emit(view, "IdleSuspended", message)
        await self._show_state(view, plan_idle(after=None, live=False, held=False, last_active=None,
                                               suspended_at=since, now=time.time()))
        # A Workflow taking it wakes this daemon at once (SandboxView.notice); the timer is the backstop for a
        # watch event missed.
        return self.settings.idle_poll

    async def _resumed(self, view: SandboxView, holder: str | None) -> None:
        """The idle-suspended sandbox is live again (restored by ``_keep_live``): say so, for whom."""
        handle = view.handle()
        assert handle is not None
        since = rfc3339(view.status.get(SUSPENDED_AT))
        await self._record(view, {IDLE_SUSPENDED: None})
        source = f" from snapshot {view.snapshots[-1]}" if view.snapshots else ""
        why = f"for Workflow {holder}" if holder else "(spec.idleSuspendAfterSeconds was removed)"
        await self._emit(view, "Resumed", f"sandbox {handle.id} resumed{source} {why}; it was suspended for idleness "
                                          f"since {since}")

    async def _drop_idle_claim(self, view: SandboxView) -> None:
        """spec.suspend wins: an idle suspend it interrupted lets go (its operation was finished first)."""
        if (await self.records.read(view.namespace, view.uid)).get(HOLDER) == IDLE_CLAIM:
            await self.records.swap_holder(view.namespace, view.uid, IDLE_CLAIM, None)

    # ------------------------------------------------------------------ suspended

    async def _keep_suspended(self, view: SandboxView, res: SandboxResource, provider: SandboxProvider) -> float | None:
        handle = view.handle()
        if handle is not None:
            holder = await self.holding.running_holder(view.namespace, await self.records.read(view.namespace, view.uid))
            if holder is not None:
                # Destroying the sandbox under a running Workflow would fail its calls: wait for it to end.
                message = f"Workflow {holder} holds this sandbox (spec.sandboxRef); it is suspended once that Workflow ends"
                if (self._condition(view, "Suspended") or {}).get("message") != message:
                    await self._transition(view, "Ready", Suspended=(False, "HeldByWorkflow", message))
                    await self._emit(view, "SuspendDeferred", message)
                return self.settings.held_retry
            if not provider.capabilities().supports(Capability.SNAPSHOT):
                message = (f"provider {res.spec.provider} cannot snapshot, so spec.suspend cannot be honoured without "
                           f"losing the workspace; the sandbox stays live. Set spec.suspend to false, or use a provider "
                           f"with the snapshot capability")
                if (self._condition(view, "Suspended") or {}).get("reason") != "SnapshotUnsupported":
                    await self._transition(view, "Ready", Suspended=(False, "SnapshotUnsupported", message))
                    await self._emit(view, "SuspendRefused", message, "Warning")
                return await self._keep_live(view, res, provider)
            await self._begin(view, "snapshot", "Suspending", Ready=(False, "Suspending", "taking a snapshot to suspend"))
            await self._finish_operation(view, res, provider)
        if view.status.get("phase") != "Suspended" or view.status.get(IDLE_SUSPENDED):
            # (An idle-suspended Sandbox is now suspended on request: the next Workflow no longer resumes it.)
            latest = view.snapshots[-1] if view.snapshots else None
            now = time.time()
            await self._record(view, {IDLE_SUSPENDED: None, SUSPENDED_AT: now})
            await self._transition(
                view, "Suspended", {"state": SUSPENDED, "stateSince": rfc3339(now)},
                Ready=(False, "Suspended", "spec.suspend is true; no live sandbox"),
                Suspended=(True, "SuspendRequested", f"suspended in snapshot {latest}" if latest else "suspended before provisioning"),
            )
        return None

    @staticmethod
    def _condition(view: SandboxView, ctype: str) -> dict[str, Any] | None:
        return find(view.status.get("conditions") or [], ctype)

    # ------------------------------------------------------------------ intent, then effect

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

    async def _secrets(self, view: SandboxView, res: SandboxResource) -> dict[tuple[str, str], str]:
        return await read_secret_values(self.api.core, view.namespace, secret_refs(res.spec.env), where="spec.env")

    # ------------------------------------------------------------------ deletion (behind the finalizer)

    async def cleanup(self, body: Mapping[str, Any], attempt: int = 0) -> None:
        """Destroy the live sandbox and every owned snapshot; :class:`CleanupPending` while the provider refuses."""
        view = self._view(body)
        view.generation = body["metadata"].get("generation")
        delay = self.settings.cleanup_backoff[min(attempt, len(self.settings.cleanup_backoff) - 1)]
        async with view.lock:
            busy = await self._hold(view)
            if busy is not None:
                self._views.pop(view.uid, None)  # the holder cleans up; nothing of this view is worth keeping
                raise CleanupPending(f"replica {view.waiting_on} reconciles this Sandbox; its cleanup runs there (or "
                                     f"here once that replica's lease runs out)", busy)
            holder = await self.holding.running_holder(view.namespace, await self.records.read(view.namespace, view.uid))
            if holder is not None:
                message = (f"Workflow {holder} holds this sandbox (spec.sandboxRef); deletion waits until it finishes "
                           f"or is cancelled")
                if (self._condition(view, "CleanupBlocked") or {}).get("message") != message:
                    await self._transition(view, "Deleting", CleanupBlocked=(True, "HeldByWorkflow", message))
                    await self._emit(view, "CleanupBlocked", message, "Warning")
                raise CleanupPending(message, self.settings.held_retry)
            try:
                name = view.provider_name
                if name is not None:  # None: no provider was ever pinned or named, so nothing was made
                    await self._destroy_everything(view, self.provider(name))
            except (ProviderError, OSError) as exc:
                if isinstance(exc, UnsupportedCapability):
                    raise
                message = f"deleting the provider's sandbox or snapshots failed: {type(exc).__name__}: {exc}; retrying in {delay:g}s"
                await self._transition(view, "Deleting", CleanupBlocked=(True, "ProviderRefused", message))
                await self._emit(view, "CleanupBlocked", message, "Warning")
                raise CleanupPending(message, delay) from None
            if self._condition(view, "CleanupBlocked") is not None:
                await self._transition(view, "Deleting", CleanupBlocked=(False, "CleanupDone", ""))
            await self._emit(view, "CleanupDone", "sandbox and snapshots deleted")
            # The Lease goes with the Sandbox (owner reference); nothing is left to reconcile.
            self._views.pop(view.uid, None)
            if view.lease is not None:
                await view.lease.forget()

    async def _destroy_everything(self, view: SandboxView, provider: SandboxProvider) -> None:
        handle = view.handle()
        op = view.status.get("operation")
        caps = provider.capabilities()
        if handle is not None and op and op["kind"] == "snapshot" and caps.supports(Capability.SNAPSHOT_RECONCILIATION):
            # A suspend was interrupted: its snapshot may exist unrecorded; the same operation id finds it.
            with contextlib.suppress(SandboxGone):
                taken = await provider.snapshot(handle, operation_id=op["id"])
                await self._patch(view, {"snapshots": [*view.snapshots, taken]})
        if handle is not None:
            await provider.destroy(handle)
            await self._patch(view, {"providerId": None, "handle": None, "leaseExpiresAt": None})
        if caps.supports(Capability.LEASE_RECONCILIATION):
            for orphan in await provider.list_sandboxes(view.owner):  # e.g. made by an interrupted provision
                await provider.destroy(orphan)
        for snapshot_id in view.snapshots:
            await provider.delete_snapshot(snapshot_id)
            await self._patch(view, {"snapshots": [s for s in view.snapshots if s != snapshot_id]})
        await self._patch(view, {"operation": None})

    async def aclose(self) -> None:
        for view in list(self._views.values()):
            if view.lease is not None:
                with contextlib.suppress(Exception):
                    await view.lease.release()
        self._views.clear()
        for provider in self._providers.values():
            with contextlib.suppress(Exception):
                await provider.aclose()


def _idle_for(after: int | None) -> str:
    return f"no call for {after}s (spec.idleSuspendAfterSeconds)" if after is not None else "idle"


def _metadata(handle: SandboxHandle) -> dict[str, Any]:
    return dict(handle.metadata)


def _parse_time(value: Any) -> float | None:
    if not value:
        return None
    import datetime as dt

    try:
        return dt.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


def _shown(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """What of a Sandbox's status the controller keeps from the API server: everything but what it acts on
    (that comes from the Sandbox's record only) and the holder (the record's, shown there by kube/holding.py)."""
    return {k: v for k, v in (status or {}).items() if k not in RECORDED and k != HOLDER}
