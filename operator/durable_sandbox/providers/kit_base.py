"""The provider contract kit's fixtures, hooks and helpers, shared by its case groups
(``providers/testing.py``): the resources a test provisions (cleaned up after it) and what a subclass supplies."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from durable_sandbox.providers.contract import (
    Capability,
    ProviderError,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
    ToolResult,
)

__all__ = ["ContractResources", "ProviderKit"]


class ContractResources:
    """Provisions through the provider under test and cleans up whatever the test left behind."""

    def __init__(self, provider: SandboxProvider, lease_seconds: int) -> None:
        self.provider = provider
        self.lease_seconds = lease_seconds
        self.owner = "contract-kit-" + uuid.uuid4().hex[:12]
        self.handles: list[SandboxHandle] = []
        self.snapshot_ids: list[str] = []
        self._counter = 0

    def spec(self, **overrides: Any) -> SandboxSpec:
        fields: dict[str, Any] = {"owner": self.owner, "labels": {"suite": "contract-kit"}}
        fields.update(overrides)
        return SandboxSpec(**fields)

    async def provision(self, **spec_overrides: Any) -> SandboxHandle:
        handle = await self.provider.provision(self.spec(**spec_overrides), lease_seconds=self.lease_seconds)
        self.handles.append(handle)
        return handle

    async def restore(self, snapshot_id: str) -> SandboxHandle:
        handle = await self.provider.restore(snapshot_id, self.spec(), lease_seconds=self.lease_seconds)
        self.handles.append(handle)
        return handle

    async def snapshot(self, handle: SandboxHandle, operation_id: str) -> str:
        snapshot_id = await self.provider.snapshot(handle, operation_id=operation_id)
        self.snapshot_ids.append(snapshot_id)
        return snapshot_id

    def op_id(self) -> str:
        self._counter += 1
        return f"kit-{self.owner}-{self._counter}"

    async def run(self, handle: SandboxHandle, type_: str, **args: Any) -> ToolResult:
        return await self.provider.execute(handle, ToolCall(operation_id=self.op_id(), type=type_, args=args))

    async def cleanup(self) -> None:
        caps = self.provider.capabilities()
        for handle in self.handles:
            try:
                await self.provider.destroy(handle)
            except ProviderError:
                pass  # a test may have lost or expired it; leaking here would only hide the real failure
        if caps.supports(Capability.SNAPSHOT_DELETION):
            for snapshot_id in self.snapshot_ids:
                try:
                    await self.provider.delete_snapshot(snapshot_id)
                except ProviderError:
                    pass


class ProviderKit:
    """The kit's fixtures and hooks: override :meth:`provider` (and the hooks you can supply)."""

    lease_seconds: ClassVar[int] = 600
    # A shell command that makes the workspace's snapshot archive larger than the provider's limit (its own
    # setting: a sparse file where its tar cannot keep one sparse, or plain bytes); None skips that case.
    oversized_workspace: ClassVar[str | None] = None

    # --------------------------------------------------------------------------------- what subclasses supply

    @pytest.fixture
    async def provider(self) -> AsyncIterator[SandboxProvider]:
        pytest.fail("ProviderContractSuite subclasses must override the `provider` fixture")
        yield  # pragma: no cover

    async def lose(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        """Make the sandbox be lost behind the provider's back. Default: the provider's own loss injection."""
        if not provider.capabilities().supports(Capability.LOSS_INJECTION):
            pytest.skip("override ProviderContractSuite.lose() to make a sandbox be lost")
        await provider.inject_loss(handle)

    async def expire_lease(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        """Make the sandbox's lease run out (move a clock; never sleep)."""
        pytest.skip("override ProviderContractSuite.expire_lease() to make a lease run out")

    # --------------------------------------------------------------------------------- plumbing

    @pytest.fixture
    async def kit(self, provider: SandboxProvider) -> AsyncIterator[ContractResources]:
        resources = ContractResources(provider, self.lease_seconds)
        yield resources
        await resources.cleanup()

    @staticmethod
    def _need(provider: SandboxProvider, *capabilities: Capability) -> None:
        missing = [c.value for c in capabilities if not provider.capabilities().supports(c)]
        if missing:
            pytest.skip(f"provider [{provider.name}] does not advertise {missing}")
