"""The engine with sandbox sessions wired in: ``ctx.sandbox`` reaches the providers through the sessions.

The bare engine (:class:`durable_sandbox.engine.Engine`) knows nothing of sandboxes or providers; this module
is where the two meet, above the stores and the built-in workflows (it registers ``sandbox-agent``).
The package root re-exports :class:`Engine` lazily; code inside the package imports it from here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from durable_sandbox.engine import Engine as _BareEngine
from durable_sandbox.engine import RunNotFound, RunStatus
from durable_sandbox.engine.executor import Unresolvable
from durable_sandbox.providers.contract import SandboxProvider
from durable_sandbox.workflows import sandbox_agent as _builtin_workflows  # noqa: F401 - registers sandbox-agent

__all__ = ["Engine"]


class Engine(_BareEngine):
    """The engine with ``ctx.sandbox`` wired to the sandbox sessions and the provider registry.

    ``store`` defaults to the embedded :class:`~durable_sandbox.stores.SqliteStore` at
    ``$DURABLE_SANDBOX_HOME/runs.db``. ``providers`` maps provider names to instances (or is a
    callable ``name -> provider``); by default providers come from the registry.
    """

    def __init__(
        self,
        store: Any = None,
        *,
        providers: Any = None,
        hibernate_after: float = 300.0,
        extensions: Iterable[object] = (),
        worker_id: str | None = None,
        lease_ttl: float = 30.0,
        inline_sleep_limit: float = 5.0,
        unresolvable: Unresolvable = "leave",
    ) -> None:
        from durable_sandbox.sandboxes.journal import SandboxJournal
        from durable_sandbox.sandboxes.passover import PassingSessionFactory
        from durable_sandbox.stores import SqliteStore
        from durable_sandbox.tracing import Tracing

        factory = PassingSessionFactory(providers)  # sessions that pass over at ctx.continue_as_new
        extensions = list(extensions)
        if not any(isinstance(e, Tracing) for e in extensions):
            # OpenTelemetry's environment (OTEL_EXPORTER_OTLP_ENDPOINT, ...) turns traces on; off, nothing is added.
            traced = Tracing.from_env()
            extensions += [traced] if traced is not None else []
        super().__init__(
            store if store is not None else SqliteStore(), sandbox_factory=factory, hooks=factory,
            reader=SandboxJournal(),
            hibernate_after=hibernate_after, extensions=extensions, worker_id=worker_id, lease_ttl=lease_ttl,
            inline_sleep_limit=inline_sleep_limit, unresolvable=unresolvable,
        )
        self._session_factory = factory

    def sandbox_provider(self, name: str) -> SandboxProvider:
        """The provider instance this engine's sandbox sessions use under ``name``."""
        return self._session_factory.providers(name)

    async def fork(
        self, run_id: str, *, after_call: int, count: int = 1, session: str | None = None,
        workflow: Any = None, input: Any = None, run_ids: Any = None,
    ) -> Any:
        """Fork run ``run_id`` at its call ``after_call``: ``count`` new runs (pending) whose sandbox workspace
        is the source's after that call, rebuilt and checked now; see sandboxes/fork.py. Returns a ``Forked``."""
        from durable_sandbox.sandboxes.fork import fork_run

        return await fork_run(self, run_id, after_call=after_call, count=count, session=session,
                              workflow=workflow, input=input, run_ids=run_ids)

    async def aclose(self) -> None:
        """Stop background runs; a run this process drove that now waits has its sandboxes hibernated
        first (snapshot, then destroy), so a process that exits while a run waits leaks nothing."""
        await super().aclose()
        for run_id in sorted(self.driven):
            # The run's head alone says whether it waits: a finished or deleted run (its journal may be half
            # collected with its Workflow) is no business of this close, and no warning.
            try:
                run = await self.store.get_run(run_id)
            except Exception:
                continue  # unreadable now: a run that waits is hibernated by its next holder, or its lease ends
            if run is None or run.status != RunStatus.WAITING:
                continue  # deleted meanwhile (with its Workflow: its sandboxes were finalized then) or not waiting
            try:
                await self.hibernate(run_id)
            except RunNotFound:
                continue
            except Exception as exc:  # a failed hibernation leaves the sandbox to its provider lease
                logging.getLogger("durable_sandbox").warning("could not hibernate waiting run %s: %s", run_id, exc)
        await self._session_factory.aclose()
