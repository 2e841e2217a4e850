"""The provider contract kit's cases of snapshots: restore, reconciliation by operation id, the size limit,
deletion (``providers/testing.py``)."""

from __future__ import annotations

import pytest

from durable_sandbox.providers.contract import (
    Capability,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxProvider,
)
from durable_sandbox.providers.kit_base import ContractResources, ProviderKit

__all__ = ["SnapshotCases"]


class SnapshotCases(ProviderKit):
    """Snapshots (for a provider that advertises them): a restore is a new sandbox with the snapshot's files, the
    same operation id reconciles to the same snapshot, an archive over the limit fails finally, deletion is
    idempotent."""

    async def test_restore_yields_a_new_sandbox_with_the_snapshot_files(self, provider: SandboxProvider,
                                                                        kit: ContractResources) -> None:
        self._need(provider, Capability.SNAPSHOT, Capability.RESTORE)
        original = await kit.provision()
        await kit.run(original, "write_file", path="state/a.txt", contents="v1")
        snapshot_id = await kit.snapshot(original, kit.op_id())
        assert isinstance(snapshot_id, str) and snapshot_id
        await kit.run(original, "write_file", path="state/a.txt", contents="v2")
        await kit.run(original, "write_file", path="later.txt", contents="after the snapshot")
        restored = await kit.restore(snapshot_id)
        assert restored.id != original.id, "restore makes a NEW sandbox"
        assert (await kit.run(restored, "read_file", path="state/a.txt")).outcome == (0, "v1", "")
        assert (await kit.run(restored, "read_file", path="later.txt")).exit_code == 1
        assert (await kit.run(original, "read_file", path="state/a.txt")).outcome == (0, "v2", ""), \
            "snapshotting leaves the source sandbox running"

    async def test_snapshot_reconciles_by_operation_id(self, provider: SandboxProvider,
                                                       kit: ContractResources) -> None:
        self._need(provider, Capability.SNAPSHOT_RECONCILIATION)
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="a.txt", contents="first")
        op = kit.op_id()
        first = await kit.snapshot(handle, op)
        await kit.run(handle, "write_file", path="a.txt", contents="second")
        again = await kit.snapshot(handle, op)
        assert again == first, "the same operation id must reconcile to the same snapshot"
        other = await kit.snapshot(handle, kit.op_id())
        assert other != first
        if provider.capabilities().supports(Capability.RESTORE):
            restored = await kit.restore(first)
            assert (await kit.run(restored, "read_file", path="a.txt")).outcome == (0, "first", ""), \
                "a reconciled snapshot still holds the state of its first taking"

    async def test_snapshot_of_a_lost_sandbox_raises_sandbox_gone(self, provider: SandboxProvider,
                                                                  kit: ContractResources) -> None:
        self._need(provider, Capability.SNAPSHOT)
        handle = await kit.provision()
        await self.lose(provider, handle)
        with pytest.raises(SandboxGone):
            await kit.snapshot(handle, kit.op_id())

    async def test_a_snapshot_over_the_providers_limit_fails_finally_and_the_sandbox_goes_on(
            self, provider: SandboxProvider, kit: ContractResources) -> None:
        """What sandbox code writes cannot make a snapshot store or restore without bound (issue 32, item 4)."""
        self._need(provider, Capability.SNAPSHOT)
        if self.oversized_workspace is None:
            pytest.skip("set ProviderContractSuite.oversized_workspace to a command that passes the snapshot limit")
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="kept.txt", contents="kept")
        assert (await kit.run(handle, "shell", command=self.oversized_workspace)).exit_code == 0
        with pytest.raises(ProviderError) as excinfo:
            await kit.snapshot(handle, kit.op_id())
        assert excinfo.value.retryable is False, "the same workspace makes the same archive: retrying cannot help"
        assert "limit" in str(excinfo.value), "the error names the limit"
        assert (await kit.run(handle, "read_file", path="kept.txt")).outcome == (0, "kept", ""), \
            "the sandbox goes on"
        assert (await kit.run(handle, "shell", command="rm -rf -- ./* && echo emptied")).exit_code == 0
        snapshot_id = await kit.snapshot(handle, kit.op_id())  # and snapshots again once it is small
        if provider.capabilities().supports(Capability.RESTORE):
            restored = await kit.restore(snapshot_id)
            assert (await kit.run(restored, "read_file", path="kept.txt")).exit_code == 1

    async def test_delete_snapshot_is_idempotent(self, provider: SandboxProvider, kit: ContractResources) -> None:
        self._need(provider, Capability.SNAPSHOT, Capability.SNAPSHOT_DELETION)
        handle = await kit.provision()
        snapshot_id = await kit.snapshot(handle, kit.op_id())
        await provider.delete_snapshot(snapshot_id)
        await provider.delete_snapshot(snapshot_id)
        if provider.capabilities().supports(Capability.RESTORE):
            with pytest.raises(ProvisionError) as excinfo:
                await provider.restore(snapshot_id, kit.spec(), lease_seconds=kit.lease_seconds)
            assert excinfo.value.retryable is False, "a deleted snapshot will not come back by retrying"
