"""The finalizer: what deleting a Workflow does before ``durable-sandbox.dev/cleanup`` may go.

The delete handler (``kube/handlers.py``) calls :meth:`Cleanup.cleanup`: the run is cancelled (here, or by
taking its lease), every sandbox session its journal does not show finalized is finalized, the snapshots a
succeeded run retained are deleted, and the Sandbox it held is let go. While the provider refuses, or another
replica still executes the run, :class:`~durable_sandbox.kube.api.errors.CleanupPending` keeps the finalizer, with
condition ``CleanupBlocked`` and an Event; kopf retries with the backoff of ``cleanup_backoff``. The journal,
not status, says what to delete: status is a projection, which anyone granted ``workflows/status`` can write.
When there is no journal to go by (the run's objects are gone already, or it fails its seals:
``JournalDamaged``), cleanup goes by what the providers themselves record: the sandboxes and snapshots tagged
with this Workflow's owner tag (``<namespace>/<uid>``), and nothing else. A Workflow executed by the namespace's
own workers (``spec.worker``) is always cleaned up that way: its journal is written by the team's code, whose word
must never make the operator delete anything (a forged record could name another namespace's sandbox).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from durable_sandbox.engine import JournalDamaged, LeaseHeld
from durable_sandbox.kube.api.errors import CleanupPending
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.workflow.chain import chain_from
from durable_sandbox.kube.workflow.finished import let_go
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.providers.contract import Capability, tag_key
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.sandboxes import journal

__all__ = ["Cleanup"]

log = logging.getLogger(__name__)


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
        if (body.get("spec") or {}).get("worker"):
            await self._queued(view, body, engine, delay)
            return
        try:
            run = await engine.store.get_run(run_id)
            if run is not None:  # after ctx.continue_as_new, the run its chain is at (kube/workflow/chain.py)
                run = (await chain_from(engine.store, run))[-1]
                run_id = view.run_id = run.run_id
                await engine.store.load_journal(run_id)  # its journal too must be readable to be cleaned up from
        except JournalDamaged as exc:
            await self._damaged(view, body, exc)
            run = None
        if run is None:
            await self._cleanup_by_owner(view, body, delay)
            await self._done(view, body, how="by the providers' owner tags" if view.extra.rejected else "")
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

    async def _queued(self, view: RunView, body: Mapping[str, Any], engine: Engine, delay: float) -> None:
        """A worker-executed run: a worker still executing it is told to stop (the cancel, in the journal), and what
        the providers hold under this Workflow's owner tag goes, with no worker alive as well."""
        with contextlib.suppress(JournalDamaged):
            run = await engine.store.get_run(view.run_id)
            if run is not None and not run.status.terminal and not run.cancel_requested:
                await engine.client.request_cancel(view.run_id, "the Workflow was deleted")
        await self._cleanup_by_owner(view, body, delay)
        await self._done(view, body, how="by the providers' owner tags (a worker's journal decides no deletion)")

    async def _cancel(self, view: RunView, body: Mapping[str, Any], engine: Engine,
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

    async def _delete_retained(self, engine: Engine, run_id: str, body: Mapping[str, Any]) -> None:
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
        for kept in retained:
            provider = providers.get(kept.session)
            if provider is None:  # a retained snapshot of a session the journal shows no provision of: not ours
                log.warning("run %s: retained snapshot %s has no provider on record; left to the orphan sweep",
                            run_id, kept.snapshot_id)
                continue
            async with self.wing.engines.provider_for_once(provider) as made:
                await made.delete_snapshot(kept.snapshot_id)

    async def _finalize_leftovers(self, engine: Engine, run_id: str) -> None:
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

    async def _cleanup_by_owner(self, view: RunView, body: Mapping[str, Any], delay: float) -> None:
        """No journal to go by: destroy the sandboxes and delete the snapshots that the providers themselves tag
        with this Workflow's owner tag (never what status names: anyone granted workflows/status writes it)."""
        spec = body.get("spec") or {}
        if spec.get("sandboxRef"):
            return  # its calls ran in a Sandbox resource's sandbox: that Sandbox's, not this Workflow's
        # The provider the spec names (fixed at creation); when it names none, the run's was the operator's default
        # at the time, which may not be today's: every provider this operator can use is asked.
        named = (spec.get("sandbox") or {}).get("provider")
        names = [str(named)] if named else self.wing.engines.usable_provider_names()
        owner, installation = view.owner, self.wing.settings.installation_id
        for name in names:
            try:
                async with self.wing.engines.provider_for_once(name) as provider:
                    caps = provider.capabilities()
                    if caps.supports(Capability.LEASE_RECONCILIATION):
                        for handle in await provider.list_sandboxes(owner):
                            await provider.destroy(handle)
                    if caps.supports(Capability.INVENTORY):
                        for entry in await provider.inventory_snapshots(installation):
                            if entry.owner_key == tag_key(owner):
                                await provider.delete_snapshot(entry.id)
            except Exception as exc:
                await self._blocked(view, body, f"cleanup by owner tag ({name}) is blocked: {type(exc).__name__}: "
                                                f"{exc}", delay)

    async def _blocked(self, view: RunView, body: Mapping[str, Any], message: str, delay: float) -> None:
        view.extra.cleanup_blocked = message
        self.wing.publisher.emit(body, LifecycleEvent("CleanupBlocked", message[:1024], "Warning"))
        await self.wing.publisher.patch_conditions(view, body)
        raise CleanupPending(message, delay)

    async def _damaged(self, view: RunView, body: Mapping[str, Any], exc: JournalDamaged) -> None:
        """A journal that fails its seals (or is gone) met only here, at deletion, is said as a run says its own:
        the Failed condition with the reason (JournalTampered, JournalDamaged, JournalLost) and a Warning Event
        naming the object and key; not only a line in the operator's log under a Normal CleanupDone."""
        message = f"{exc} Cleanup goes by the providers' owner tags of this Workflow instead."
        if view.extra.rejected != (exc.reason, message):
            view.extra.rejected = (exc.reason, message)
            self.wing.publisher.emit(body, LifecycleEvent(exc.reason, message[:1024], "Warning"))
        await self.wing.publisher.patch_conditions(view, body)

    async def _done(self, view: RunView, body: Mapping[str, Any], how: str = "") -> None:
        if not self.wing.engines.journals.collected_with_workflow:
            # A PostgreSQL journal has no owner reference to go by: the run goes with its Workflow, here (every
            # run of its continue-as-new chain, newest first: a retry after a crash finds the rest from the first).
            store = self.wing.engines.engine_for(view.namespace).store
            first = await store.get_run(cluster_run_id(view.name, view.uid))
            chain = await chain_from(store, first) if first is not None else []
            for run_id in dict.fromkeys([view.run_id, *(r.run_id for r in reversed(chain))]):
                await store.delete_run(run_id)
        await let_go(self.wing.holding, view)
        if view.extra.cleanup_blocked is not None:
            view.extra.cleanup_blocked = None
            await self.wing.publisher.patch_conditions(view, body)
        await self.wing.publisher.events.emit(dict(body), LifecycleEvent(
            "CleanupDone", f"run {view.run_id}: sandboxes and snapshots deleted" + (f" {how}" if how else "")))
