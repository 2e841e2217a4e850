"""Provider contract kit: a reusable pytest suite proving that a provider honours contract v1.

Usage (any provider, ours or a third party's)::

    import pytest
    from durable_sandbox.providers.testing import ProviderContractSuite

    class TestMyProviderContract(ProviderContractSuite):
        @pytest.fixture
        async def provider(self, tmp_path):
            p = MyProvider(root=tmp_path)
            yield p
            await p.aclose()

        async def lose(self, provider, handle):       # make the sandbox vanish behind the provider's back
            ...
        async def expire_lease(self, provider, handle):  # make the sandbox's lease run out (no sleeping)
            ...

pytest collects every ``test_*`` method of the subclass. Tests of capabilities the provider does not
advertise check that the calls raise :class:`UnsupportedCapability` before acting; tests that need a hook the
subclass did not supply are skipped with a message naming the hook. Requires pytest-asyncio (auto mode or
``asyncio`` markers applied by the subclass).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

import pytest

from durable_sandbox.providers.contract import (
    CONTRACT_VERSION,
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    TOOL_TYPES,
    Capability,
    ProviderCapabilities,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
    ToolResult,
    UnsupportedCapability,
    tag_key,
)

__all__ = ["ContractResources", "ProviderContractSuite"]

_BOGUS_ID = "contract-kit-no-such-sandbox"


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


def _expect_unsupported(excinfo: pytest.ExceptionInfo[UnsupportedCapability], provider: SandboxProvider,
                        capability: Capability) -> None:
    error = excinfo.value
    assert error.capability == capability.value, f"raised for [{error.capability}], expected [{capability.value}]"
    assert str(error) == (
        f"Sandbox provider [{provider.name}] does not support [{capability.value}]; the operation was not attempted."
    )
    assert error.retryable is False


class ProviderContractSuite:
    """Subclass as ``Test<Something>`` and override :meth:`provider` (and the hooks you can supply)."""

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

    # --------------------------------------------------------------------------------- declarations

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

    # --------------------------------------------------------------------------------- tool types

    async def test_shell_reports_exit_code_stdout_and_stderr(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        assert (await kit.run(handle, "shell", command="echo hello")).outcome == (0, "hello\n", "")
        result = await kit.run(handle, "shell", command="printf out; printf err >&2; exit 3")
        assert result.outcome == (3, "out", "err"), "a nonzero exit is a result, not an exception"

    async def test_write_file_then_read_file_and_shell_see_it(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        written = await kit.run(handle, "write_file", path="dir/sub/note.txt", contents="héllo\n")
        assert written.outcome == (0, "wrote dir/sub/note.txt 7 bytes", ""), "size counts UTF-8 bytes"
        assert (await kit.run(handle, "read_file", path="dir/sub/note.txt")).outcome == (0, "héllo\n", "")
        assert (await kit.run(handle, "shell", command="cat dir/sub/note.txt")).outcome == (0, "héllo\n", "")
        await kit.run(handle, "write_file", path="dir/sub/note.txt", contents="v2")
        assert (await kit.run(handle, "read_file", path="dir/sub/note.txt")).outcome == (0, "v2", ""), "overwrites"

    async def test_read_missing_file_is_a_failed_result(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        result = await kit.run(handle, "read_file", path="missing.txt")
        assert result.outcome == (1, "", "File not found: missing.txt")

    async def test_unknown_tool_type_is_a_failed_result(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        result = await kit.run(handle, "teleport", destination="mars")
        assert result.outcome == (1, "", "Unsupported tool type: teleport")

    async def test_shell_cwd_and_env(self, kit: ContractResources) -> None:
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="sub/a.txt", contents="x")
        result = await kit.run(handle, "shell", command='cat a.txt; printf %s "$GREETING"', cwd="sub",
                               env={"GREETING": "hi"})
        assert result.outcome == (0, "xhi", "")

    async def test_sandboxes_are_separate(self, kit: ContractResources) -> None:
        first, second = await kit.provision(), await kit.provision()
        assert first.id != second.id
        await kit.run(first, "write_file", path="only-here.txt", contents="1")
        assert (await kit.run(second, "read_file", path="only-here.txt")).exit_code == 1

    async def test_spec_env_reaches_commands_but_not_the_handle(self, provider: SandboxProvider,
                                                                kit: ContractResources) -> None:
        secret = "kit-secret-" + uuid.uuid4().hex
        handle = await kit.provision(env={"KIT_SECRET": secret})
        assert handle.provider == provider.name
        for text in (handle.model_dump_json(), repr(handle), str(handle.metadata)):
            assert secret not in text, "handles are persisted in journals: they must never hold secrets"
        assert (await kit.run(handle, "shell", command='printf %s "$KIT_SECRET"')).outcome == (0, secret, "")

    # --------------------------------------------------------------------------------- lifecycle

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

    # --------------------------------------------------------------------------------- snapshots

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

    # --------------------------------------------------------------------------------- reconciliation, loss

    async def test_list_sandboxes_finds_owners_sandboxes(self, provider: SandboxProvider,
                                                         kit: ContractResources) -> None:
        self._need(provider, Capability.LEASE_RECONCILIATION)
        mine = {(await kit.provision()).id, (await kit.provision()).id}
        theirs = await kit.provision(owner=kit.owner + "-other")
        listed = await provider.list_sandboxes(kit.owner)
        assert {h.id for h in listed} == mine
        assert all(h.provider == provider.name for h in listed)
        assert theirs.id not in {h.id for h in listed}
        gone = next(h for h in kit.handles if h.id in mine)
        await provider.destroy(gone)
        assert {h.id for h in await provider.list_sandboxes(kit.owner)} == mine - {gone.id}

    async def test_inventory_lists_an_installations_sandboxes_and_snapshots_with_their_tags(
            self, provider: SandboxProvider, kit: ContractResources) -> None:
        self._need(provider, Capability.INVENTORY)
        installation = f"kit/{kit.owner}"
        labels = {INSTALLATION_LABEL: installation, "suite": "contract-kit"}
        mine = await kit.provision(labels=labels)
        other_owner = await kit.provision(labels=labels, owner=kit.owner + "-b")
        other_installation = await kit.provision(labels={INSTALLATION_LABEL: installation + "-other"})
        untagged = await kit.provision()
        listed = {h.id: h for h in await provider.inventory_sandboxes(installation)}
        assert set(listed) == {mine.id, other_owner.id}, "every owner's sandboxes of the installation, nothing else"
        assert listed[mine.id].metadata["owner"] == kit.owner
        assert listed[other_owner.id].metadata["owner"] == kit.owner + "-b"
        assert listed[mine.id].metadata["labels"][INSTALLATION_LABEL] == installation
        assert all(h.provider == provider.name for h in listed.values())
        if provider.capabilities().supports(Capability.SNAPSHOT):
            kept = await kit.provision(labels={**labels, RETAIN_LABEL: "true"})
            ours = await kit.snapshot(mine, kit.op_id())
            retained = await kit.snapshot(kept, kit.op_id())
            await kit.snapshot(other_installation, kit.op_id())
            await kit.snapshot(untagged, kit.op_id())
            await provider.destroy(mine)  # a snapshot outlives its sandbox, tags included
            entries = {e.id: e for e in await provider.inventory_snapshots(installation)}
            assert set(entries) == {ours, retained}
            assert entries[ours].installation_key == tag_key(installation) and entries[ours].provider == provider.name
            assert entries[ours].owner_key == tag_key(kit.owner) and entries[ours].retained is False
            assert entries[retained].retained is True, "a session that may hand its snapshot over marks it"
            await provider.destroy(kept)
            if provider.capabilities().supports(Capability.SNAPSHOT_DELETION):
                await provider.delete_snapshot(ours)
                assert {e.id for e in await provider.inventory_snapshots(installation)} == {retained}
        await provider.destroy(other_owner)
        await provider.destroy(mine)
        assert [h.id for h in await provider.inventory_sandboxes(installation)] == [], "destroyed ones are not listed"

    async def test_inject_loss_makes_the_sandbox_gone(self, provider: SandboxProvider,
                                                      kit: ContractResources) -> None:
        self._need(provider, Capability.LOSS_INJECTION)
        handle = await kit.provision()
        await provider.inject_loss(handle)
        with pytest.raises(SandboxGone):
            await kit.run(handle, "shell", command="true")

    async def test_reset_processes_ends_what_calls_left_running_and_keeps_the_sandbox(
            self, provider: SandboxProvider, kit: ContractResources) -> None:
        """A shared sandbox changing hands (issue 32 item 6): processes a call left behind, however detached
        (``env -i`` drops any tag a provider puts in the env; ``setsid``, ``nohup``, a double fork), are gone after
        ``reset_processes``; the sandbox, its files and later calls are unchanged."""
        self._need(provider, Capability.PROCESS_RESET)
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="kept.txt", contents="kept")
        marker = "kit-left-" + uuid.uuid4().hex[:12]
        loop = "while :; do sleep 1; done"
        quiet = "</dev/null >/dev/null 2>&1"
        await kit.run(handle, "shell", command=(
            f"env -i /bin/sh -c '{loop}' {marker}-envi {quiet} & "
            f"setsid /bin/sh -c '{loop}' {marker}-setsid {quiet} & "
            f"nohup /bin/sh -c '{loop}' {marker}-nohup {quiet} & "
            f"( /bin/sh -c '{loop}' {marker}-forked {quiet} & ) ; echo started"))
        await provider.reset_processes(handle)
        # The pattern's brackets keep the counting shell's own command line from matching it.
        pattern = marker.replace("kit-left-", "kit-lef[t]-")
        count = ("n=0; for d in /proc/[0-9]*; do case \"$(tr '\\000' ' ' 2>/dev/null < $d/cmdline)\" in "
                 f"*{pattern}*) n=$((n+1)) ;; esac; done; echo $n")
        left = (await kit.run(handle, "shell", command=count)).outcome
        assert left == (0, "0\n", ""), f"processes the call left survived the reset: {left}"
        assert (await kit.run(handle, "read_file", path="kept.txt")).outcome == (0, "kept", "")
        assert (await kit.run(handle, "shell", command="echo alive")).outcome == (0, "alive\n", "")

    async def test_suspend_and_resume_keep_files(self, provider: SandboxProvider, kit: ContractResources) -> None:
        self._need(provider, Capability.SUSPEND, Capability.RESUME)
        handle = await kit.provision()
        await kit.run(handle, "write_file", path="kept.txt", contents="kept")
        await provider.suspend(handle)
        resumed = await provider.resume(handle)
        assert (await kit.run(resumed, "read_file", path="kept.txt")).outcome == (0, "kept", "")
