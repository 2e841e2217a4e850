"""The provider contract kit's cases of what a provider declares: its name, contract version and capabilities, and
that what it does not support is refused before acting (``providers/testing.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from durable_sandbox.providers.contract import (
    CONTRACT_VERSION,
    TOOL_TYPES,
    Capability,
    ProviderCapabilities,
    SandboxHandle,
    SandboxProvider,
    UnsupportedCapability,
)
from durable_sandbox.providers.kit_base import ContractResources, ProviderKit

__all__ = ["DeclarationCases"]

_BOGUS_ID = "contract-kit-no-such-sandbox"


def _expect_unsupported(excinfo: pytest.ExceptionInfo[UnsupportedCapability], provider: SandboxProvider,
                        capability: Capability) -> None:
    error = excinfo.value
    assert error.capability == capability.value, f"raised for [{error.capability}], expected [{capability.value}]"
    assert str(error) == (
        f"Sandbox provider [{provider.name}] does not support [{capability.value}]; the operation was not attempted."
    )
    assert error.retryable is False


class DeclarationCases(ProviderKit):
    """Identity, consistent capabilities, and ``UnsupportedCapability`` raised before acting."""

    def test_identity(self, provider: SandboxProvider) -> None:
        assert isinstance(provider, SandboxProvider)
        assert isinstance(provider.name, str) and provider.name and provider.name != "abstract"
        assert provider.contract_version == CONTRACT_VERSION

    def test_capabilities_are_consistent(self, provider: SandboxProvider) -> None:
        caps = provider.capabilities()
        assert isinstance(caps, ProviderCapabilities)
        assert caps.consistency_problems() == []
        assert set(TOOL_TYPES) <= set(caps.tool_types), "every provider runs shell, write_file and read_file"
        assert caps == provider.capabilities(), "capabilities must not change between calls"

    async def test_unsupported_capabilities_raise_before_acting(self, provider: SandboxProvider,
                                                                kit: ContractResources) -> None:
        caps = provider.capabilities()
        # A handle and snapshot that do not exist: a provider that talked to its backend before checking
        # the capability would raise SandboxGone (or similar) instead of UnsupportedCapability.
        bogus = SandboxHandle(id=_BOGUS_ID, provider=provider.name)
        attempts: dict[Capability, Callable[[], Awaitable[Any]]] = {
            Capability.SNAPSHOT: lambda: provider.snapshot(bogus, operation_id="kit-unsupported"),
            Capability.RESTORE: lambda: provider.restore("kit-no-such-snapshot", kit.spec(), lease_seconds=kit.lease_seconds),
            Capability.SNAPSHOT_DELETION: lambda: provider.delete_snapshot("kit-no-such-snapshot"),
            Capability.SNAPSHOT_COPY: lambda: provider.copy_snapshot("kit-no-such-snapshot", operation_id="kit-unsupported"),
            Capability.SUSPEND: lambda: provider.suspend(bogus),
            Capability.RESUME: lambda: provider.resume(bogus),
            Capability.LEASE_RECONCILIATION: lambda: provider.list_sandboxes(kit.owner),
            Capability.LOSS_INJECTION: lambda: provider.inject_loss(bogus),
            Capability.INVENTORY: lambda: provider.inventory_sandboxes(kit.owner),
            Capability.PROCESS_RESET: lambda: provider.reset_processes(bogus),
        }
        unsupported = [cap for cap in attempts if not caps.supports(cap)]
        if not caps.supports(Capability.INVENTORY):
            with pytest.raises(UnsupportedCapability) as excinfo:
                await provider.inventory_snapshots(kit.owner)
            _expect_unsupported(excinfo, provider, Capability.INVENTORY)
        for cap in unsupported:
            with pytest.raises(UnsupportedCapability) as excinfo:
                await attempts[cap]()
            _expect_unsupported(excinfo, provider, cap)
        if not unsupported:
            return
        # And against a live sandbox: the refused calls left it untouched.
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="canary.txt", contents="alive")
        live: dict[Capability, Callable[[], Awaitable[Any]]] = {
            Capability.SNAPSHOT: lambda: provider.snapshot(handle, operation_id="kit-unsupported-live"),
            Capability.SUSPEND: lambda: provider.suspend(handle),
            Capability.RESUME: lambda: provider.resume(handle),
            Capability.LOSS_INJECTION: lambda: provider.inject_loss(handle),
            Capability.PROCESS_RESET: lambda: provider.reset_processes(handle),
        }
        for cap, attempt in live.items():
            if not caps.supports(cap):
                with pytest.raises(UnsupportedCapability) as excinfo:
                    await attempt()
                _expect_unsupported(excinfo, provider, cap)
        canary = (await kit.run(handle, "read_file", path="canary.txt")).outcome
        assert canary == (0, "alive", ""), f"the refused calls changed the sandbox: read_file gave {canary}"
