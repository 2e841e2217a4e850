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
  (``kube/holders/holding.py``), so no Workflow's call runs while it is half suspended; it stays suspended until a
  Workflow takes it, which resumes it from the snapshot (``IdleSuspended``, ``Resumed`` Events). The
  explicit ``spec.suspend`` wins over it either way.

What the controller acts on (the live sandbox's id and handle, the snapshots it owns, the operation in
progress, its phase) is kept in the Sandbox's own record (``kube/journal/sandbox_records.py``: a sealed Journal object
no namespace role grants) and shown in status; status is never read back as truth (anyone granted
``sandboxes/status`` can write it), so nobody but the operator can point a Sandbox at another tenant's sandbox
or snapshot.

Crash safety: every provider side effect is preceded by a record of its intent (``operation``: kind and a
stable operation id). A restart finishes the recorded operation: a
provision or restore looks for the sandbox by owner tag and operation label first (and destroys any
other sandbox this Sandbox owns), among those the provider vouches for (the kubernetes provider lists only
Pods it sealed over their uid: a Pod planted with the labels is never adopted nor destroyed), a snapshot is taken again under the same operation id (reconciling
providers return the same snapshot), a destroy is repeated (idempotent). So a SIGKILL anywhere leaves
exactly one live sandbox, or exactly one snapshot, after the restart.

Status is written only by the controller (``status.py``), through the status subresource (merge patches),
one write per transition, right after the record. Which room does what: ``kube/sandbox/__init__.py``.

One replica at a time: every replica runs a daemon for every Sandbox, but only the holder of the
Sandbox's ``coordination.k8s.io`` Lease (``dsbx.<uid>``, owned by the Sandbox, see ``kube/journal/leases.py``)
reconciles it and runs its cleanup; the others look again when the holder's lease would run out, so a
dead holder is taken over after about one lease period, and one that stops (SIGTERM) releases it. A
holder that loses its lease (not renewed in time, taken over) stops the reconciliation in progress at
once; the operation recorded in status makes that as safe as a crash. A new holder reads the status
back from the API server before it acts (the previous holder wrote it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from durable_sandbox.kube.sandbox.finalizer import SandboxFinalizer
from durable_sandbox.kube.sandbox.operations import SnapshotRefused

__all__ = ["SandboxController", "SnapshotRefused"]


class SandboxController(SandboxFinalizer):
    """The Sandbox controller of one replica: the daemon kopf runs per Sandbox, over the rooms below it."""

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

    async def aclose(self) -> None:
        for view in list(self._views.values()):
            if view.lease is not None:
                with contextlib.suppress(Exception):
                    await view.lease.release()
        self._views.clear()
        for provider in self._providers.values():
            with contextlib.suppress(Exception):
                await provider.aclose()
