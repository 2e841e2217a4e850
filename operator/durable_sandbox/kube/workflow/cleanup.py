"""The finalizer: what deleting a Workflow does before ``durable-sandbox.dev/cleanup`` may go.

The delete handler (``kube/handlers.py``) calls :meth:`Cleanup.cleanup`: the run is cancelled (here, or by
taking its lease), every sandbox session its journal does not show finalized is finalized, the snapshots a
succeeded run retained are deleted, and the Sandbox it held is let go. While the provider refuses, or another
replica still executes the run, :class:`~durable_sandbox.kube.errors.CleanupPending` keeps the finalizer, with
condition ``CleanupBlocked`` and an Event; kopf retries with the backoff of ``cleanup_backoff``. The journal,
not status, says what to delete (status is a projection); only when the run's objects are gone already does
cleanup fall back to the ids in status.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import durable_sandbox
from durable_sandbox.engine import LeaseHeld
from durable_sandbox.kube.errors import CleanupPending
from durable_sandbox.kube.events import LifecycleEvent
from durable_sandbox.kube.plan import cluster_run_id
from durable_sandbox.kube.workflow.finished import let_go
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.providers.contract import SandboxHandle
from durable_sandbox.sandboxes import journal

__all__ = ["Cleanup"]


class Cleanup:
    def __init__(self, wing: Wing) -> None:
        self.wing = wing

    async def cleanup(self, body: Mapping[str, Any], attempt: int = 0) -> None:
        """Cancel the run, finalize every sandbox and snapshot (from the journal), then return so the
        finalizer can go. Raises :class:`CleanupPending` while that cannot finish (retried with backoff)."""
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        run_id = cluster_run_id(name, uid)
        engine = self.wing.engines.engine_for(namespace)
        view = self.wing.runs.views.get(run_id) or RunView(namespace=namespace, name=name, uid=uid, run_id=run_id, body=body)
        delay = self.wing.settings.cleanup_backoff[min(attempt, len(self.wing.settings.cleanup_backoff) - 1)]
        run = await engine.store.get_run(run_id)
        if run is None:
            await self._cleanup_from_status(view, body, delay)
            await self._done(view, body)
            return
        if not run.status.terminal:
            await self._cancel(view, body, engine, run.cancel_requested, delay)
        # Whatever ended the run (a cleanup that failed while it was cancelled included), every sandbox
        # session its journal does not show finalized is finalized now.
        if engine.executor.is_executing(run_id):
            raise CleanupPending(f"run {run_id} is still stopping in this replica", delay)
        try:
            await self._finalize_leftovers(engine, run_id)
            await self._delete_retained(engine, run_id, body)
        except LeaseHeld as exc:
            raise CleanupPending(f"run {run_id} is still held by another replica ({exc})", delay) from None
        except Exception as exc:
            await self._blocked(view, body, f"cleanup of run {run_id} is blocked: {type(exc).__name__}: {exc}", delay)
        await self._done(view, body)

    async def _cancel(self, view: RunView, body: Mapping[str, Any], engine: durable_sandbox.Engine,
                      requested: str | None, delay: float) -> None:
        run_id = view.run_id
        if not requested:
            await engine.client.request_cancel(run_id, "the Workflow was deleted")
        try:
            if not await engine.executor.cancel_here(run_id, "the Workflow was deleted"):
                await engine.executor.drive_cancel(run_id)
        except LeaseHeld as exc:
            raise CleanupPending(f"run {run_id} is executing on another replica; it cancels there ({exc})", delay) from None
        except Exception as exc:
            await self._blocked(view, body, f"cleanup of run {run_id} is blocked: {type(exc).__name__}: {exc}", delay)

    async def _delete_retained(self, engine: durable_sandbox.Engine, run_id: str, body: Mapping[str, Any]) -> None:
        """A succeeded run's retained snapshots (retainLatestSnapshot) outlive the run, not its Workflow: the
        finalized sessions skip them, so they go here (deleting a snapshot is idempotent). The journal names
        them (each session's finalize record), not status: status is a projection, and a replica that did
        not execute the run's end may have written it from fewer rows (an older snapshot as the latest)."""
        # With spec.sandboxRef the snapshots are the Sandbox resource's: never deleted here.
        if (body.get("spec") or {}).get("sandboxRef"):
            return
        providers: dict[str, str] = {}  # session id -> its provider (pinned for the whole run)
        retained: list[journal.Retained] = []
        for row in await engine.store.load_journal(run_id):
            if (pinned := journal.pinned_provider(row)) is not None:
                providers[pinned[0]] = pinned[1]
            elif (kept := journal.retained(row)) is not None:
                retained.append(kept)
        shown = str(((body.get("status") or {}).get("sandbox") or {}).get("provider") or "")
        for kept in retained:
            await self.wing.engines.provider(providers.get(kept.session) or shown).delete_snapshot(kept.snapshot_id)

    async def _finalize_leftovers(self, engine: durable_sandbox.Engine, run_id: str) -> None:
        executor = engine.executor
        hooks = executor.hooks
        if hooks is None:
            return
        async with contextlib.AsyncExitStack() as stack:
            lease = await engine.store.claim(run_id, executor.worker_id, executor.lease_ttl)
            stack.push_async_callback(engine.store.release, lease)
            run = await engine.store.get_run(run_id)
            if run is not None:
                await hooks.cancel_cleanup(executor, run, lease)

    async def _cleanup_from_status(self, view: RunView, body: Mapping[str, Any], delay: float) -> None:
        """The run's objects are gone already: the ids cleanup needs are in status too."""
        st = body.get("status") or {}
        sandbox = st.get("sandbox") or {}
        provider_name = sandbox.get("provider")
        if not provider_name:
            return
        try:
            provider = self.wing.engines.provider(provider_name)
            if st.get("latestSnapshot"):
                await provider.delete_snapshot(st["latestSnapshot"])
            # A Sandbox resource's sandbox (spec.sandboxRef) outlives the Workflow: never destroyed here.
            if sandbox.get("providerId") and not (body.get("spec") or {}).get("sandboxRef"):
                await provider.destroy(SandboxHandle(id=sandbox["providerId"], provider=provider_name))
        except Exception as exc:
            await self._blocked(view, body, f"cleanup from status is blocked: {type(exc).__name__}: {exc}", delay)

    async def _blocked(self, view: RunView, body: Mapping[str, Any], message: str, delay: float) -> None:
        view.extra.cleanup_blocked = message
        self.wing.publisher.emit(body, LifecycleEvent("CleanupBlocked", message[:1024], "Warning"))
        await self.wing.publisher.patch_conditions(view, body)
        raise CleanupPending(message, delay)

    async def _done(self, view: RunView, body: Mapping[str, Any]) -> None:
        await let_go(self.wing.objects, view)
        if view.extra.cleanup_blocked is not None:
            view.extra.cleanup_blocked = None
            await self.wing.publisher.patch_conditions(view, body)
        await self.wing.publisher.events.emit(dict(body), LifecycleEvent(
            "CleanupDone", f"run {view.run_id}: sandboxes and snapshots deleted"))
