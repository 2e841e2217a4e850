"""What ``durable_sandbox.Engine`` plugs into the bare engine as ``ctx.sandbox``, and the engine's hooks at a run's
end: cleanup of the sessions a run left (cancelled or waiting while not executing), from the journal alone."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from durable_sandbox.engine import Context
from durable_sandbox.engine.executor import RunExecutor
from durable_sandbox.engine.records import Lease, RunRecord, RunStatus
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.providers.contract import ConfigurationError, SandboxProvider
from durable_sandbox.sandboxes.journal import sessions_in
from durable_sandbox.sandboxes.session import SandboxSession
from durable_sandbox.sandboxes.state import SessionState
from durable_sandbox.sandboxes.traced import traced_provider

ProviderSource = Mapping[str, SandboxProvider] | Callable[[str], SandboxProvider] | None


class SessionFactory:
    """What ``durable_sandbox.Engine`` plugs into the bare engine as ``ctx.sandbox``."""

    def __init__(self, providers: ProviderSource = None) -> None:
        self._source = providers
        self._cache: dict[str, SandboxProvider] = {}

    def providers(self, name: str) -> SandboxProvider:
        if name in self._cache:
            return self._cache[name]
        if isinstance(self._source, Mapping):
            if name not in self._source:
                known = ", ".join(sorted(self._source)) or "none"
                raise ConfigurationError(f"Unknown sandbox provider [{name}]; this engine has: {known}")
            provider = self._source[name]
        elif callable(self._source):
            provider = self._source(name)
        else:
            from durable_sandbox.providers.registry import create_provider

            provider = create_provider(name)
        if provider.name != name:
            raise ConfigurationError(f"Provider registered as [{name}] calls itself [{provider.name}]; refusing it")
        self._cache[name] = provider
        return provider

    def __call__(self, ctx: Context, id: str, *, provider: str = "local", **options: Any) -> SandboxSession:
        rt = ctx.operations
        sid = ctx.scope + id
        return SandboxSession(rt, sid, traced_provider(rt, sid, self.providers(provider)), **options)

    async def _cleanup_sessions(self, rt: RunRuntime, action: str) -> None:
        rows = rt.known_rows()
        for sid in sessions_in(rows):
            state = SessionState.derive(sid, rows)
            state.reopen_for(rt.epoch)
            if state.finalized or state.provider is None:
                continue
            session = SandboxSession(rt, sid, self.providers(state.provider), lease_seconds=int(state.options.get("leaseSeconds", 3600)))
            if action == "hibernate":
                await session.hibernate()
            else:
                await session.finalize(succeeded=False)

    async def after_run(self, rt: RunRuntime, status: RunStatus) -> None:
        """A retained snapshot passes to the caller only if the *run* succeeds: when it fails or is
        cancelled after its sandbox block ended, the snapshot is deleted like any other."""
        if getattr(status, "value", status) == "succeeded":
            return
        rows = rt.known_rows()
        for sid in sessions_in(rows):
            state = SessionState.derive(sid, rows)
            kept = [c for c in state.checkpoints if state.finalized and c.snapshot_id == state.retained]
            if kept and state.provider is not None:
                session = SandboxSession(rt, sid, self.providers(state.provider))
                await session.checkpointer.delete(kept[0])

    async def cancel_cleanup(self, executor: RunExecutor, run: RunRecord, lease: Lease) -> None:
        """Finalize every sandbox session of a run that is cancelled while not executing."""
        rt = await executor.open_runtime(run, lease)
        await self._cleanup_sessions(rt, "finalize")

    async def hibernate_run(self, executor: RunExecutor, run: RunRecord, lease: Lease) -> None:
        """Hibernate every live sandbox of a waiting run (snapshot, then destroy)."""
        rt = await executor.open_runtime(run, lease)
        await self._cleanup_sessions(rt, "hibernate")

    async def aclose(self) -> None:
        for provider in self._cache.values():
            await provider.aclose()
