"""Issue 32 item 6: a shared Sandbox changing hands ends what the last holder's calls left running before the next
holder's first call (``kube/holders/holder_processes.py``), with the real ``Holding`` and ``SandboxRecords`` over a Journal
object in memory and the real local provider (its processes are real). The record says whose the processes are by
run id (name and uid), so the same run re-attaching keeps its own, and a Workflow of the same name made anew (another
uid) does not."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.kube.holders.holder_processes import CLEARED_FOR, HolderProcesses
from durable_sandbox.kube.holders.holding import SandboxHeld
from durable_sandbox.providers.contract import Capability, SandboxHandle, SandboxProvider, SandboxSpec
from durable_sandbox.providers.local import LocalProvider
from tests.unit.kube.sandbox_records_support import LIVE, NAME, NS, UID, World


class Recording(LocalProvider):
    """The local provider, counting resets (with or without the capability)."""

    def __init__(self, home: Path, *, can_reset: bool = True) -> None:
        super().__init__(home)
        self.resets: list[str] = []
        self.can_reset = can_reset

    def capabilities(self) -> Any:
        caps = super().capabilities()
        if self.can_reset:
            return caps
        return caps.model_copy(update={"supported": caps.supported - {Capability.PROCESS_RESET}})

    async def reset_processes(self, handle: SandboxHandle) -> None:
        self.resets.append(handle.id)
        await super().reset_processes(handle)


class Scene:
    def __init__(self, home: Path, *, can_reset: bool = True) -> None:
        self.provider = Recording(home, can_reset=can_reset)
        self.handle = asyncio.run(self.provider.provision(SandboxSpec(), lease_seconds=600))
        self.world = World({**LIVE, "providerId": self.handle.id, "handle": {}})

        @contextlib.asynccontextmanager
        async def provider_for(name: str) -> AsyncIterator[SandboxProvider]:
            assert name == "local"
            yield self.provider

        self.clearing = HolderProcesses(self.world.objects, self.world.records, provider_for)  # type: ignore[arg-type]

    def attach(self, workflow: str, run_id: str) -> SandboxHandle:
        """What a run's session does to reach the Sandbox: take it (Holding), then clear it for the run."""
        self.world.running.add(workflow)
        handle = asyncio.run(self.world.holding.live_handle(NS, NAME, workflow))
        asyncio.run(self.clearing.clear_for(NS, NAME, workflow, run_id, handle))
        return handle

    def finish(self, workflow: str) -> None:
        self.world.running.discard(workflow)
        asyncio.run(self.world.holding.release(NS, NAME, workflow))


def test_each_new_holder_gets_the_sandbox_cleared_and_a_run_re_attaching_keeps_its_processes(home: Path) -> None:
    scene = Scene(home)
    scene.attach("wf-a", "wf-a-uid1")
    assert scene.provider.resets == [scene.handle.id], "cleared before A's first call"
    assert scene.world.record()[CLEARED_FOR] == {"run": "wf-a-uid1", "sandbox": scene.handle.id}
    scene.attach("wf-a", "wf-a-uid1")  # A's run re-attaching (a resume, a takeover): its own processes stay
    assert scene.provider.resets == [scene.handle.id]
    scene.finish("wf-a")
    scene.attach("wf-b", "wf-b-uid2")
    assert scene.provider.resets == [scene.handle.id] * 2, "cleared before B's first call"
    scene.finish("wf-b")
    scene.attach("wf-b", "wf-b-uid3")  # a Workflow of the same name made anew: another holder, by uid
    assert scene.provider.resets == [scene.handle.id] * 3


def test_a_new_live_sandbox_is_cleared_for_the_same_run_again(home: Path) -> None:
    """The mark names the live sandbox too: after a resume into a new sandbox the same run gets it cleared."""
    scene = Scene(home)
    scene.attach("wf-a", "wf-a-uid1")
    other = asyncio.run(scene.provider.provision(SandboxSpec(), lease_seconds=600))
    asyncio.run(scene.world.records.write(NS, NAME, UID, {"providerId": other.id}))
    assert scene.attach("wf-a", "wf-a-uid1").id == other.id
    assert scene.provider.resets == [scene.handle.id, other.id]


def test_the_mark_is_written_only_while_the_workflow_still_holds_the_sandbox(home: Path) -> None:
    scene = Scene(home)
    scene.world.running.add("wf-a")
    handle = asyncio.run(scene.world.holding.live_handle(NS, NAME, "wf-a"))
    scene.finish("wf-a")
    scene.world.hold("wf-b")  # taken by another Workflow meanwhile
    with pytest.raises(SandboxHeld, match="changed hands"):
        asyncio.run(scene.clearing.clear_for(NS, NAME, "wf-a", "wf-a-uid1", handle))
    assert CLEARED_FOR not in scene.world.record()


def test_a_provider_that_cannot_end_processes_is_said_and_the_sandbox_is_one_trust_domain(
        home: Path, caplog: pytest.LogCaptureFixture) -> None:
    scene = Scene(home, can_reset=False)
    scene.attach("wf-a", "wf-a-uid1")
    assert scene.provider.resets == []
    assert "cannot end the processes earlier holders left" in caplog.text and "one trust domain" in caplog.text
