"""The provider contract kit's cases of finding and handling sandboxes: listing by owner, an installation's
inventory, loss injection, process reset, suspend and resume (``providers/testing.py``)."""

from __future__ import annotations

import uuid

import pytest

from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    Capability,
    SandboxGone,
    SandboxProvider,
    tag_key,
)
from durable_sandbox.providers.kit_base import ContractResources, ProviderKit

__all__ = ["ReconciliationCases"]


class ReconciliationCases(ProviderKit):
    """Listing by owner and inventory by installation find exactly what they should; loss injection, process reset
    and suspend/resume do what they say and keep what they should."""

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
