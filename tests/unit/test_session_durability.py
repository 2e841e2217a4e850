"""Issue 35 item 1: a Sandbox's session calls are durable. Snapshots every ``spec.snapshotEveryNCalls`` completed
calls (the superseded one deleted only after the new one is recorded); after a loss the newest snapshot is
restored and every later completed call replayed in order (nonzero exits included, outcomes checked, ``onReplay``
honoured), invisible to the caller but as latency; a call started and never answered (the operator died while it
ran) is never run again in the sandbox it may have changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.providers.contract import (
    Capability,
    ProviderCapabilities,
    SandboxHandle,
    ToolCall,
    ToolResult,
)
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.hold import HoldSettings
from durable_sandbox.sessions.journal import calls_run_id
from durable_sandbox.sessions.models import CallRequest, ShellRequest
from durable_sandbox.sessions.rebuild import REBUILD, held_by
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, FakeGate, effects, local_gate, service, service_and_journal


class Died(BaseException):
    """The operator process dying at a point (a BaseException: nothing on the way handles it)."""


class CrashingProvider(LocalProvider):
    """A LocalProvider whose ``execute`` of one operation id dies once: before running it, or after (its effect
    made, its answer never returned)."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.die: tuple[str, str] | None = None  # (operation id, "before" | "after")

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        die, self.die = self.die, None
        if die is not None and die == (call.operation_id, "before"):
            raise Died
        result = await super().execute(handle, call)
        if die is not None and die == (call.operation_id, "after"):
            raise Died
        if die is not None:
            self.die = die
        return result


def shell(op: str, command: str, **fields: Any) -> ShellRequest:
    return ShellRequest(operationId=op, command=command, **fields)


async def setup(tmp_path: Path, every: int, provider: LocalProvider | None = None) -> tuple[FakeGate, SqliteStore, SessionService]:
    gate = await local_gate(tmp_path / "home", provider)
    store = SqliteStore(tmp_path / "runs.db")
    gate.store, gate.snapshot_every = store, every
    return gate, store, service(store, gate)


async def send(svc: SessionService, *requests: CallRequest) -> list[Any]:
    return [await svc.call("good-token", NAMESPACE, "box", r) for r in requests]


def exists(path: Path) -> bool:
    return path.exists()


def workspace(gate: FakeGate) -> Path:
    return Path(gate.handle.metadata["workspace"])


async def rows(store: SqliteStore) -> list[OperationRecord]:
    return await store.load_journal(calls_run_id("uid-1"))


async def test_every_n_calls_a_snapshot_and_the_superseded_one_deleted_only_after_the_new_is_recorded(tmp_path: Path) -> None:
    gate, store, svc = await setup(tmp_path, every=2)
    await send(svc, *(shell(f"c{i}", f"echo {i} >> f") for i in range(5)))
    journal = [(r.op_id, r.status) for r in await rows(store) if "snapshot" in r.op_id]
    taken = [op for op, status in journal if status == "completed" and "delete" not in op]
    assert len(taken) == 2  # after calls 2 and 4
    first_deleted = next(i for i, (op, status) in enumerate(journal) if "delete" in op and status == "started")
    second_recorded = next(i for i, (op, status) in enumerate(journal) if op == taken[1] and status == "completed")
    assert second_recorded < first_deleted
    snapshots = [r.result["snapshotId"] for r in await rows(store) if r.op_id in taken and r.status == "completed"]
    assert not gate.provider._snapshot_path(snapshots[0]).exists()
    assert gate.provider._snapshot_path(snapshots[1]).exists()


async def test_a_loss_restores_the_newest_snapshot_and_replays_the_later_calls_unseen_by_the_caller(tmp_path: Path) -> None:
    outside = tmp_path / "outside.log"
    gate, store, svc = await setup(tmp_path, every=3)
    calls: list[CallRequest] = [shell(f"c{i}", f"echo {i} >> f") for i in range(6)]
    calls += [shell("c6", f"echo side >> {outside}", onReplay="skip"),  # an effect outside: never run again
              shell("c7", "echo 7 >> f; echo seven; exit 3")]  # a nonzero exit is a completed call: replayed too
    answers = await send(svc, *calls)
    assert answers[-1].exitCode == 3
    lost = gate.handle
    await gate.provider.inject_loss(lost)
    after = await send(svc, shell("c8", "cat f"))
    assert after[0].exitCode == 0 and after[0].stdout == "".join(f"{i}\n" for i in range(8) if i != 6)
    [after_six] = [r.result["snapshotId"] for r in await rows(store)
                   if r.kind == "sandbox.snapshot" and r.status == "completed" and r.meta["count"] == 6]
    assert gate.replacements == [(lost.id, after_six)]  # the newest snapshot when it was lost
    [rebuilt] = [r for r in await rows(store) if r.op_id.startswith(REBUILD + "/") and r.status == "completed" and r.meta["from"] == 6]
    assert rebuilt.result == {"replayed": ["c7"]}  # c6 skipped (onReplay: skip)
    assert effects(outside) == ["side"]


async def test_a_loss_noticed_under_a_hold_gives_the_hold_the_replacement(tmp_path: Path) -> None:
    """A session kept open (sessions/hold.py) meets a lost sandbox: the call waits for the controller's
    replacement, the calls after its snapshot are replayed, and the hold keeps the replacement: the next calls run
    there without taking the Sandbox again or replacing it again."""
    gate, store, _ = await setup(tmp_path, every=2)
    svc, journal = service_and_journal(store, gate, hold=HoldSettings(idle_seconds=60, max_seconds=600))
    await send(svc, *(shell(f"c{i}", f"echo {i} >> f") for i in range(3)))
    lost = gate.handle
    await gate.provider.inject_loss(lost)
    answers = await send(svc, shell("c3", "echo 3 >> f"), shell("c4", "echo 4 >> f; cat f"))
    assert answers[-1].stdout == "0\n1\n2\n3\n4\n"
    assert [gone for gone, _ in gate.replacements] == [lost.id] and gate.handle.id != lost.id
    assert (gate.taken, gate.released, journal.open_sessions()) == (1, 0, 1)  # one hold throughout
    await journal.aclose()
    assert gate.released == 1


async def test_without_snapshots_a_loss_replays_every_call_in_order(tmp_path: Path) -> None:
    gate, _, svc = await setup(tmp_path, every=0)
    await send(svc, shell("a", "echo a >> f"), shell("b", "echo b >> f; false"), shell("c", "echo c >> f"))
    await gate.provider.inject_loss(gate.handle)
    [answer] = await send(svc, shell("d", "cat f"))
    assert answer.stdout == "a\nb\nc\n" and gate.replacements[0][1] is None


async def test_a_replay_with_another_outcome_fails_the_call_rather_than_continue_on_another_workspace(tmp_path: Path) -> None:
    gate, _, svc = await setup(tmp_path, every=0)
    await send(svc, shell("a", "date +%N"))
    await gate.provider.inject_loss(gate.handle)
    from durable_sandbox.sandboxes.session import ReconstructionError

    with pytest.raises(ReconstructionError, match="Reconstruction operation a produced a different outcome"):
        await send(svc, shell("b", "true"))


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_call_started_and_never_answered_is_not_run_again_in_the_sandbox_it_may_have_changed(
        tmp_path: Path, when: str) -> None:
    """The operator dies between a call's start and its answer (before the provider ran it, or after): the retry
    (same operationId, a new process) never runs it in that sandbox; it is replaced from the newest snapshot, the
    calls after it replayed, and the call runs once there: the workspace holds it exactly once. Its effect outside
    the sandbox happened once if the operator died before running it, at least once otherwise."""
    outside = tmp_path / "outside.log"
    provider = CrashingProvider(tmp_path / "home")
    gate, _, svc = await setup(tmp_path, every=2, provider=provider)
    await send(svc, *(shell(f"c{i}", f"echo {i} >> f") for i in range(3)))
    provider.die = ("c3", when)
    request = shell("c3", f"echo 3 >> f; echo ran >> {outside}")
    with pytest.raises(Died):
        await send(svc, request)
    first = gate.handle
    restarted = service(SqliteStore(tmp_path / "runs.db"), gate, worker="w2")
    [answer] = await send(restarted, request)
    assert answer.exitCode == 0 and not answer.replayed
    assert gate.handle.id != first.id and [lost for lost, _ in gate.replacements] == [first.id]
    assert not exists(Path(first.metadata["workspace"]))  # the unknown sandbox was destroyed
    assert (workspace(gate) / "f").read_text() == "0\n1\n2\n3\n"
    assert effects(outside) == (["ran"] if when == "before" else ["ran", "ran"])
    [again] = await send(restarted, request)
    assert again.replayed and effects(outside) == (["ran"] if when == "before" else ["ran", "ran"])


async def test_a_call_given_up_on_after_the_operator_died_leaves_no_trace_in_the_next_calls_sandbox(
        tmp_path: Path) -> None:
    """The operator dies after a call ran but before its answer, and the caller never retries it: the next,
    different call does not run in the sandbox the abandoned one changed; that sandbox is replaced and rebuilt
    from the completed calls first, so the workspace holds only answered calls."""
    provider = CrashingProvider(tmp_path / "home")
    gate, _, svc = await setup(tmp_path, every=2, provider=provider)
    await send(svc, *(shell(f"c{i}", f"echo {i} >> f") for i in range(3)))
    provider.die = ("lost", "after")
    with pytest.raises(Died):
        await send(svc, shell("lost", "echo lost >> f"))
    first = gate.handle
    restarted = service(SqliteStore(tmp_path / "runs.db"), gate, worker="w2")
    [answer] = await send(restarted, shell("next", "echo next >> f"))
    assert answer.exitCode == 0 and not answer.replayed
    assert gate.handle.id != first.id and [lost for lost, _ in gate.replacements] == [first.id]
    assert (workspace(gate) / "f").read_text() == "0\n1\n2\nnext\n"


async def test_an_idle_resumed_sandbox_holds_every_call_and_nothing_is_replayed(tmp_path: Path) -> None:
    """A suspend's snapshot holds every call the suspended sandbox held (lineage: the resumed sandbox -> the
    snapshot -> the sandbox it was taken of)."""
    gate, store, svc = await setup(tmp_path, every=0)
    await send(svc, shell("a", "echo a >> f"), shell("b", "echo b >> f"))
    suspended = gate.handle
    snapshot = await gate.provider.snapshot(suspended, operation_id="suspend-1")
    await gate.provider.destroy(suspended)
    gate.handle = await _restore(gate, snapshot)
    gate.lineage_of.update({snapshot: suspended.id, gate.handle.id: snapshot})
    [answer] = await send(svc, shell("c", "cat f"))
    assert answer.stdout == "a\nb\n" and gate.replacements == []
    rebuilt = [r for r in await rows(store) if r.op_id == f"{REBUILD}/{gate.handle.id}"]
    assert [(r.status, r.meta["from"], r.result) for r in rebuilt] == [("completed", 2, {"replayed": []})]


async def _restore(gate: FakeGate, snapshot: str) -> SandboxHandle:
    from durable_sandbox.providers.contract import SandboxSpec

    return await gate.provider.restore(snapshot, SandboxSpec(owner="demo/uid-1"), lease_seconds=600)


def test_what_a_sandbox_holds_follows_its_lineage() -> None:
    held = {"sbx-1": 4}
    snapshots = {"snap-2": 6}
    lineage = {"sbx-2": "snap-1", "snap-1": "sbx-1", "sbx-3": "snap-2", "sbx-4": "", "sbx-5": "snap-x"}
    assert held_by("sbx-1", held, snapshots, lineage) == 4
    assert held_by("sbx-2", held, snapshots, lineage) == 4  # resumed from a suspend's snapshot of sbx-1
    assert held_by("sbx-3", held, snapshots, lineage) == 6  # restored from the session's snapshot after call 6
    assert held_by("sbx-4", held, snapshots, lineage) == 0  # provisioned fresh
    assert held_by("sbx-5", held, snapshots, lineage) is None  # a snapshot nobody recorded
    assert held_by("sbx-9", held, snapshots, lineage) is None


class NoSnapshots(LocalProvider):
    def capabilities(self) -> ProviderCapabilities:
        caps = super().capabilities()
        return caps.model_copy(update={"supported": caps.supported - {Capability.SNAPSHOT}})


async def test_snapshots_every_n_calls_on_a_provider_that_cannot_snapshot_are_refused_before_anything_runs(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside.log"
    _, _, svc = await setup(tmp_path, every=2, provider=NoSnapshots(tmp_path / "home"))
    with pytest.raises(CallRefused) as refused:
        await send(svc, shell("a", f"echo ran >> {outside}"))
    assert refused.value.status == 409 and refused.value.body.where.endswith("spec.snapshotEveryNCalls")
    assert effects(outside) == []
