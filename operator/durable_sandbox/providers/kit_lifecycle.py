"""The provider contract kit's cases of a sandbox's life: destroy, loss, its lease (``providers/testing.py``)."""

from __future__ import annotations

import pytest

from durable_sandbox.providers.contract import (
    SandboxGone,
    SandboxProvider,
)
from durable_sandbox.providers.kit_base import ContractResources, ProviderKit

__all__ = ["LifecycleCases"]


class LifecycleCases(ProviderKit):
    """``destroy`` is idempotent; a lost sandbox or an expired lease is ``SandboxGone``; renewal keeps it."""

    async def test_destroy_is_idempotent(self, provider: SandboxProvider, kit: ContractResources) -> None:
        assert provider.capabilities().idempotent_destroy
        handle = await kit.provision()
        await provider.destroy(handle)
        await provider.destroy(handle)
        with pytest.raises(SandboxGone) as excinfo:
            await kit.run(handle, "shell", command="true")
        assert excinfo.value.sandbox_id == handle.id

    async def test_lost_sandbox_raises_sandbox_gone(self, provider: SandboxProvider, kit: ContractResources) -> None:
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="a.txt", contents="a")
        await self.lose(provider, handle)
        for type_, args in (("shell", {"command": "true"}), ("read_file", {"path": "a.txt"}),
                            ("write_file", {"path": "b.txt", "contents": "b"})):
            with pytest.raises(SandboxGone) as excinfo:
                await kit.run(handle, type_, **args)
            assert excinfo.value.sandbox_id == handle.id
            assert excinfo.value.retryable is False, "loss triggers recovery, not a retry"
        with pytest.raises(SandboxGone):
            await provider.renew_lease(handle, kit.lease_seconds)
        await provider.destroy(handle)  # destroying what is already gone succeeds

    async def test_lease_renewal_keeps_the_sandbox(self, provider: SandboxProvider, kit: ContractResources) -> None:
        handle = await kit.provision()
        renewed = await provider.renew_lease(handle, kit.lease_seconds * 2)
        assert renewed.id == handle.id and renewed.provider == handle.provider
        if handle.lease_expires_at is not None:
            assert renewed.lease_expires_at is not None and renewed.lease_expires_at > handle.lease_expires_at
        assert (await kit.run(renewed, "shell", command="echo ok")).outcome == (0, "ok\n", "")

    async def test_expired_lease_means_sandbox_gone(self, provider: SandboxProvider, kit: ContractResources) -> None:
        handle = await kit.provision()
        await self.expire_lease(provider, handle)
        with pytest.raises(SandboxGone) as excinfo:
            await kit.run(handle, "shell", command="true")
        assert excinfo.value.sandbox_id == handle.id
