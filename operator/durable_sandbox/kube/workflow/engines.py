"""The engines the Workflow controller executes runs with: one per namespace, over that namespace's
store (``KubernetesStore`` or PostgreSQL: kube/store/journals.py; observed by the publisher), with the operator's provider policy and the services the
engine's extensions read for the run they serve (Secret values and literal env values handed over by
admission, the owner tag of its sandboxes, the live sandbox of an attached Sandbox resource, the labels of
every sandbox this operator makes)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from durable_sandbox.engine import JournalDamaged
from durable_sandbox.engine.continue_as_new import follow
from durable_sandbox.engine.records import Commit, RunRecord, RunStatus
from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.api.resources import WORKFLOWS, CustomObjects
from durable_sandbox.kube.holders.holder_processes import HolderProcesses
from durable_sandbox.kube.holders.holding import Holding
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.store.journals import JournalStores
from durable_sandbox.kube.workflow.chain import chain_owner
from durable_sandbox.kube.workflow.children import ChildObjects
from durable_sandbox.kube.workflow.observed import ObservedStore
from durable_sandbox.kube.workflow.publishing import Publisher
from durable_sandbox.kube.workflow.refusal_notices import refusal_hold
from durable_sandbox.kube.workflow.runs import Runs, RunView
from durable_sandbox.kube.workflow.settings import OperatorPolicy, OperatorSettings
from durable_sandbox.providers.contract import INSTALLATION_LABEL, ConfigurationError, SandboxHandle
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.sandboxes.session import SandboxServices
from durable_sandbox.workflows.sandbox_agent import AgentServices

__all__ = ["Engines"]


class Engines:
    def __init__(self, api: KubeClient, objects: CustomObjects, policy: OperatorPolicy, settings: OperatorSettings,
                 runs: Runs, publisher: Publisher, journals: JournalStores, providers: Any = None) -> None:
        self.api = api
        self.objects = objects
        self.policy = policy
        self.settings = settings
        self.runs = runs
        self.publisher = publisher
        self._providers = providers
        self.journals = journals  # each namespace's store: the API server's Journal objects or PostgreSQL
        self.holding: Holding | None = None  # set by the Operator (it needs run_live, from here)
        # Set by the Operator: a run of this replica made runnable by a write here (a child's end wakes its parent).
        self.runnable: Callable[[str], None] | None = None
        # A child workflow of a run executed here is a Workflow object of its own (kube/workflow/children.py).
        self.children = ChildObjects(objects, runs, lambda namespace: self.engine_for(namespace).store,
                                     journals.journal_key, publisher.emit)

    def engine_for(self, namespace: str) -> Engine:
        engine = self.runs.engines.get(namespace)
        if engine is None:
            store = ObservedStore(self.journals.store_for(namespace),
                                  self._written,
                                  self.publisher.event_interval, self.publisher.read,
                                  lambda run: chain_owner(self.runs, run))
            engine = Engine(
                store,
                worker_id=self.settings.worker_id,
                lease_ttl=self.settings.lease_ttl,
                providers=self.provider,
                hibernate_after=self.settings.hibernate_after,
                unresolvable="leave",
                extensions=[
                    SandboxServices(owner=self._owner_for, labels=self.sandbox_labels, attached=self._attached_sandbox,
                                    cleanup_attempts=self.settings.cleanup_attempts),
                    AgentServices(env_values=self._env_values_for, secrets=self._secrets_for),
                    refusal_hold(self.runs, self.publisher),  # a refused journal write holds the run, said
                    self.children.placement(namespace),  # each child run a Workflow of its own
                ],
            )
            self.runs.engines[namespace] = engine
        return engine

    def _written(self, run_id: str, commit: Commit | None, changes: dict[str, Any] | None) -> None:
        """A write of this replica's engines: status and Events follow it; a run it made runnable (``pending``: a
        child's end waking its parent) takes a turn at once rather than at its parked timer."""
        self.publisher.observed(run_id, commit, changes)
        status = (changes or {}).get("status") or ((commit.run or {}).get("status") if commit is not None else None)
        # Also a parked run whose status changed here (a child cancelled with its parent): its turn says so.
        if self.runnable is not None and (status == RunStatus.PENDING
                                          or (status is not None and run_id in self.runs.parked)):
            self.runnable(run_id)

    @property
    def sandbox_labels(self) -> dict[str, str]:
        """Labels of every sandbox this operator provisions (Workflows' and Sandbox resources')."""
        return {INSTALLATION_LABEL: self.settings.installation_id}

    def provider(self, name: str) -> Any:
        """Provider ``name`` under this operator's policy (the local provider only when allowed); Sandbox
        resources get theirs here too."""
        if name == "local" and not self.policy.allow_local_provider:
            raise ConfigurationError(
                "The local provider is not allowed by this operator (it is no isolation boundary); start the "
                "operator with --allow-local-provider for development, or use another provider."
            )
        if self._providers is None:
            from durable_sandbox.providers.registry import create_provider

            return create_provider(name)
        return self._providers(name) if callable(self._providers) else self._providers[name]

    @contextlib.asynccontextmanager
    async def provider_for_once(self, name: str) -> AsyncIterator[Any]:
        """Provider ``name`` (see :meth:`provider`) for one job outside any run (a cleanup, a finished run's
        leftovers): one made for it (by the registry or the operator's factory, as ``dsb operator`` gives) is closed
        after it, or its HTTP pools are left open (asyncio's "Unclosed client session" ERROR when it is collected);
        one of a fixed mapping of providers is its owner's to close."""
        provider = self.provider(name)
        try:
            yield provider
        finally:
            if self._providers is None or callable(self._providers):
                with contextlib.suppress(Exception):
                    await provider.aclose()

    def usable_provider_names(self) -> list[str]:
        """The providers this operator may use (the local provider only when allowed) and can build here (their
        configuration is present): the orphan sweep's, and a cleanup's that cannot trust a journal."""
        import os

        from durable_sandbox.providers.registry import available_providers

        return sorted(name for name, cls in available_providers().items()
                      if not (name == "local" and not self.policy.allow_local_provider)
                      and not cls.configuration_problems(os.environ))

    # ------------------------------------------------------------------ services, for the run they serve

    def _secrets_for(self, run_id: str) -> dict[tuple[str, str], str]:
        return self.runs.secrets.get(run_id, {})

    def _env_values_for(self, run_id: str) -> dict[str, str] | None:
        # Literal env values are kept out of the stored input (they may be secrets): the Workflow object
        # has them, and every daemon re-plans its object before it drives the run.
        return self.runs.env_values.get(run_id)

    def _owner_for(self, run_id: str) -> str | None:
        view = self.runs.views.get(run_id)
        return view.owner if view is not None else None

    async def _attached_sandbox(self, run_id: str, name: str) -> SandboxHandle:
        """The only way a run reaches a Sandbox resource's live sandbox, whatever named it (spec.sandboxRef, an
        entrypoint's input): only while this run's Workflow holds the Sandbox (taken here if it is free)."""
        view = self.runs.views.get(run_id)
        if view is None or self.holding is None:
            raise RuntimeError(f"run {run_id} is not served by this operator")
        handle = await self.holding.live_handle(view.namespace, name, view.name)
        # Nothing an earlier holder's calls left running meets this run's calls (kube/holders/holder_processes.py).
        await HolderProcesses(self.holding.objects, self.holding.records, self.provider_for_once).clear_for(
            view.namespace, name, view.name, run_id, handle)
        return handle

    async def run_live(self, namespace: str, workflow: str) -> bool:
        """Whether Workflow ``workflow`` exists and its run has not finished, by its own journal (never its
        status, which anyone granted workflows/status can write). A run not created yet is live (admission
        takes a Sandbox before it creates the run); one whose journal fails its seals is not (it is stopped)."""
        body = await self.objects.get(WORKFLOWS, namespace, workflow)
        if body is None:
            return False
        meta = body["metadata"]
        try:
            run = await self.current_run(namespace, cluster_run_id(meta["name"], meta["uid"]))
        except JournalDamaged:
            return False
        return run is None or not run.status.terminal

    async def current_run(self, namespace: str, run_id: str) -> RunRecord | None:
        """The record of the run a Workflow's run ``run_id`` is at: after ctx.continue_as_new, the last of its
        chain (engine/continue_as_new.py ``follow``), so a chain that goes on is not taken for finished."""
        store = self.engine_for(namespace).store
        run: RunRecord | None = await store.get_run(run_id)
        return await follow(store, run) if run is not None else None

    def forget_run(self, view: RunView) -> None:
        """The run's task ended: its head's bookkeeping in the store goes too (read again when the run is next
        active), unless the run is being deleted or still executes here."""
        engine = self.runs.engines.get(view.namespace)
        if (engine is not None and hasattr(engine.store, "forget") and not view.deleting
                and not engine.executor.is_executing(view.run_id)):
            engine.store.forget(view.run_id)

    async def aclose(self) -> None:
        for engine in self.runs.engines.values():
            with contextlib.suppress(Exception):
                await engine.aclose()
        with contextlib.suppress(Exception):
            await self.journals.aclose()
