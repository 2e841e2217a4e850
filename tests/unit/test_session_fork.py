"""Issue 36 item 2, in the call service: a Sandbox with ``spec.from: {sandbox: NAME, afterCall: N}`` starts with its
source's first N session calls (sessions/fork_seed.py): its workspace is rebuilt from them in a fresh sandbox of
its own with the outcome check, its next call is its call N+1, and nothing of the source's (sandbox, snapshot, env)
is the fork's: the source can be deleted once the fork's session was opened."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from durable_sandbox.engine import faults
from durable_sandbox.kube.sandbox.checkpoints import delete_session_snapshots
from durable_sandbox.providers.contract import (
    Capability,
    ProviderCapabilities,
    SandboxHandle,
    SandboxProvider,
)
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes.session import ReconstructionError, SessionState
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.fork_seed import FROM_OP, SourceRef
from durable_sandbox.sessions.journal import SESSION, SandboxRef, SessionJournal, calls_run_id
from durable_sandbox.sessions.models import ReadFileRequest, RewindRequest, ShellRequest
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, FakeAuth, FakeGate, local_gate


@dataclass
class Boxes:
    """Several Sandboxes of namespace demo, each a FakeGate of its own (uid, live sandbox, replacements)."""

    gates: dict[str, tuple[str, FakeGate]] = field(default_factory=dict)
    sources: dict[str, SourceRef] = field(default_factory=dict)

    async def find(self, namespace: str, name: str) -> SandboxRef:
        if name not in self.gates:
            raise CallRefused(404, "no such Sandbox", where=f"Sandbox {namespace}/{name}", do="create it")
        uid, gate = self.gates[name]
        return SandboxRef(namespace, name, uid, snapshot_every=gate.snapshot_every, source=self.sources.get(name))

    @contextlib.asynccontextmanager
    async def live(self, ref: SandboxRef) -> AsyncIterator[tuple[SandboxHandle, SandboxProvider]]:
        async with self.gates[ref.name][1].live(ref) as taken:
            yield taken

    async def replaced(self, ref: SandboxRef, lost: str) -> SandboxHandle:
        return await self.gates[ref.name][1].replaced(ref, lost)

    async def lineage(self, ref: SandboxRef) -> Mapping[str, str]:
        return await self.gates[ref.name][1].lineage(ref)

    async def rewound(self, ref: SandboxRef, to_call: int, rewound: list[str]) -> None:
        await self.gates[ref.name][1].rewound(ref, to_call, rewound)


async def setup(tmp_path: Path, every: int = 0) -> tuple[Boxes, SqliteStore, SessionService]:
    provider = LocalProvider(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    boxes = Boxes()
    for name, uid in (("box", "uid-1"), ("fork", "uid-2"), ("fork2", "uid-3")):
        gate = await local_gate(tmp_path / "home", provider)
        gate.store, gate.snapshot_every = store, every
        boxes.gates[name] = (uid, gate)
    auth = FakeAuth(rights={"alice": {(NAMESPACE, n) for n in ("box", "fork", "fork2", "gone", "workflow:wf")},
                            "bob": {(NAMESPACE, "fork")}})
    journal = SessionJournal(store, worker_id="w1", lease_ttl=10.0, owned=False)
    return boxes, store, SessionService(auth, boxes, lambda _ns: journal)  # type: ignore[arg-type]


async def lines(svc: SessionService, name: str, *ops: str) -> None:
    for op in ops:
        await svc.call("good-token", NAMESPACE, name, ShellRequest(operationId=op, command=f"echo {op} >> notes.txt"))


def notes(boxes: Boxes, name: str) -> list[str]:
    path = Path(boxes.gates[name][1].handle.metadata["workspace"]) / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


async def test_a_fork_starts_with_its_sources_first_n_calls_rebuilt_in_a_sandbox_of_its_own(tmp_path: Path) -> None:
    boxes, store, svc = await setup(tmp_path, every=2)
    await lines(svc, "box", *(f"c{i}" for i in range(6)))
    boxes.sources["fork"] = SourceRef("box", None, 3)
    await lines(svc, "fork", "f3")
    assert notes(boxes, "fork") == ["c0", "c1", "c2", "f3"]
    assert notes(boxes, "box") == [f"c{i}" for i in range(6)]  # the source untouched
    rows = await store.load_journal(calls_run_id("uid-2"))
    [origin] = [r for r in rows if r.op_id == FROM_OP]
    assert origin.meta == {"sandbox": "box", "uid": "uid-1", "afterCall": 3}
    state = SessionState.derive(SESSION, rows)
    assert [state.calls[i][0] for i in sorted(state.calls)] == ["calls/c0", "calls/c1", "calls/c2", "calls/f3"]
    # Its snapshots are its own (taken by its session: after 2 and 4 of its calls), none of the source's.
    source_snaps = {r.result["snapshotId"] for r in await store.load_journal(calls_run_id("uid-1"))
                    if r.kind == "sandbox.snapshot" and r.status == "completed"}
    fork_snaps = {r.result["snapshotId"] for r in rows if r.kind == "sandbox.snapshot" and r.status == "completed"}
    assert fork_snaps and not fork_snaps & source_snaps


async def test_the_source_can_go_once_the_fork_is_seeded_and_a_loss_of_the_fork_replays_its_calls(tmp_path: Path) -> None:
    boxes, _, svc = await setup(tmp_path)
    await lines(svc, "box", "a", "b", "c")
    boxes.sources["fork"] = SourceRef("box", None, 2)
    await lines(svc, "fork", "x")
    del boxes.gates["box"]  # the source deleted
    fork_gate = boxes.gates["fork"][1]
    await fork_gate.provider.inject_loss(fork_gate.handle)
    await lines(svc, "fork", "y")
    assert notes(boxes, "fork") == ["a", "b", "x", "y"]


async def test_a_fork_seeds_the_sources_reads_which_have_only_their_completion_and_replays_only_its_writes(
        tmp_path: Path) -> None:
    boxes, store, svc = await setup(tmp_path)
    await lines(svc, "box", "a")
    await svc.call("good-token", NAMESPACE, "box", ReadFileRequest(operationId="r", path="notes.txt"))
    await lines(svc, "box", "b", "c")
    boxes.sources["fork"] = SourceRef("box", None, 3)
    await lines(svc, "fork", "x")
    assert notes(boxes, "fork") == ["a", "b", "x"]
    rows = await store.load_journal(calls_run_id("uid-2"))
    assert [r.status for r in rows if r.op_id == "calls/r"] == ["completed"]
    state = SessionState.derive(SESSION, rows)
    assert [state.calls[i][0] for i in sorted(state.calls)] == ["calls/a", "calls/r", "calls/b", "calls/x"]
    again = await svc.call("good-token", NAMESPACE, "fork", ReadFileRequest(operationId="r", path="notes.txt"))
    assert again.replayed and again.stdout == "a\n"


async def test_a_fork_is_refused_past_the_sources_calls_for_a_missing_source_and_to_who_may_not_call_the_source(
        tmp_path: Path) -> None:
    boxes, _, svc = await setup(tmp_path)
    await lines(svc, "box", "a")
    boxes.sources["fork"] = SourceRef("box", None, 2)
    with pytest.raises(CallRefused) as past:
        await lines(svc, "fork", "x")
    assert past.value.status == 409 and "afterCall is 2" in past.value.body.what
    boxes.sources["fork"] = SourceRef("gone", None, 1)
    with pytest.raises(CallRefused) as missing:
        await lines(svc, "fork", "x")
    assert missing.value.status == 409 and "gone cannot be read" in missing.value.body.what
    boxes.sources["fork"] = SourceRef(None, "wf", 1)  # no Workflow of that name (no uid found)
    with pytest.raises(CallRefused) as workflow:
        await lines(svc, "fork", "x")
    assert workflow.value.status == 409 and "Workflow wf cannot be read: no such Workflow" in workflow.value.body.what
    boxes.sources["fork"] = SourceRef("box", None, 1)
    with pytest.raises(CallRefused) as denied:  # bob may call the fork, not its source
        await svc.call("other-token", NAMESPACE, "fork", ShellRequest(operationId="x", command="true"))
    assert denied.value.status == 403
    assert notes(boxes, "fork") == []


async def test_a_diverging_replay_fails_the_forks_call_with_expected_and_actual(tmp_path: Path) -> None:
    boxes, _, svc = await setup(tmp_path)
    await lines(svc, "box", "a")
    await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId="clock", command="date +%s%N"))
    boxes.sources["fork"] = SourceRef("box", None, 2)
    with pytest.raises(ReconstructionError) as diverged:
        await lines(svc, "fork", "x")
    assert "clock" in str(diverged.value)
    boxes.sources["fork2"] = SourceRef("box", None, 1)  # before the clock call: that fork works
    await lines(svc, "fork2", "y")
    assert notes(boxes, "fork2") == ["a", "y"]


async def test_a_fork_rewound_to_its_fork_point_is_made_without_a_call(tmp_path: Path) -> None:
    boxes, _, svc = await setup(tmp_path)
    await lines(svc, "box", "a", "b", "c")
    boxes.sources["fork"] = SourceRef("box", None, 2)
    done = await svc.rewind("good-token", NAMESPACE, "fork", RewindRequest(toCall=2))
    assert done.rewound == [] and done.replayed == ["a", "b"]
    assert notes(boxes, "fork") == ["a", "b"]


WF_UID = "77777777-0000-4000-8000-000000000007"


async def run_workflow(tmp_path: Path, calls: int) -> str:
    """Workflow ``wf``'s run (the built-in sandbox-agent over toolCalls) in the same namespace's store."""
    import durable_sandbox
    from durable_sandbox.kube.spec.plan import cluster_run_id
    from durable_sandbox.workflows.sandbox_agent import sandbox_agent

    engine = durable_sandbox.Engine(SqliteStore(tmp_path / "runs.db"),
                                    providers={"local": LocalProvider(tmp_path / "home")}, worker_id="wf")
    spec = {"toolCalls": [{"type": "shell", "command": f"echo w{i} >> notes.txt"} for i in range(calls)],
            "sandbox": {"provider": "local"}, "snapshotEveryNCalls": 2}
    state = await engine.run(sandbox_agent, spec, run_id=cluster_run_id("wf", WF_UID))
    assert state.status == "succeeded", state
    await engine.aclose()
    return cluster_run_id("wf", WF_UID)


async def test_a_sandbox_from_a_workflow_starts_with_the_workflows_first_n_calls(tmp_path: Path) -> None:
    """spec.from.workflow: the Workflow's run's first N calls become the Sandbox's (under calls/, its own session),
    replayed into its own sandbox; the fork record names the Workflow and its uid; only who may get the Workflow
    may call the fork."""
    boxes, store, svc = await setup(tmp_path, every=2)
    await run_workflow(tmp_path, 5)
    boxes.sources["fork"] = SourceRef(None, "wf", 3, workflow_uid=WF_UID)
    with pytest.raises(CallRefused) as denied:  # bob may call the fork, not get the Workflow
        await svc.call("other-token", NAMESPACE, "fork", ShellRequest(operationId="x", command="true"))
    assert denied.value.status == 403
    await lines(svc, "fork", "f3")
    assert notes(boxes, "fork") == ["w0", "w1", "w2", "f3"]
    rows = await store.load_journal(calls_run_id("uid-2"))
    [origin] = [r for r in rows if r.op_id == FROM_OP]
    assert origin.meta == {"workflow": "wf", "uid": WF_UID, "afterCall": 3}
    state = SessionState.derive(SESSION, rows)
    assert state.completed == 4 and all(state.calls[i][0].startswith("calls/") for i in state.calls)
    boxes.sources["fork2"] = SourceRef(None, "wf", 6, workflow_uid=WF_UID)
    with pytest.raises(CallRefused) as past:
        await lines(svc, "fork2", "x")
    assert past.value.status == 409 and "afterCall is 6, but Workflow wf has completed 5" in past.value.body.what


# --- issue 36 leftovers: a Sandbox fork restores its source's newest snapshot at or before N (sessions/fork_restore.py)


def snapshot_files(tmp_path: Path) -> set[str]:
    """The snapshots the local provider holds (what a deletion must leave none of)."""
    return {p.name for p in (tmp_path / "home").rglob("*.tar") if "snapshot" in str(p.parent)}


def replayed(rows: list[Any]) -> list[str]:
    """Every call replayed into a fork's sandboxes, in order (the journal's rebuild records)."""
    return [op for r in rows if r.op_id.startswith("rebuild/") and r.status == "completed"
            for op in (r.result or {}).get("replayed", [])]


async def source_checkpoint(store: SqliteStore, uid: str) -> tuple[int, str]:
    [cp] = SessionState.derive(SESSION, await store.load_journal(calls_run_id(uid))).checkpoints
    return cp.count, cp.snapshot_id


async def test_a_fork_restores_its_own_copy_of_the_sources_snapshot_and_replays_only_the_calls_after_it(
        tmp_path: Path) -> None:
    boxes, store, svc = await setup(tmp_path, every=2)
    await lines(svc, "box", *(f"c{i}" for i in range(5)))  # the source keeps its snapshot after 4 calls
    count, source_snapshot = await source_checkpoint(store, "uid-1")
    assert count == 4
    fork_gate = boxes.gates["fork"][1]
    fresh = fork_gate.handle.id
    boxes.sources["fork"] = SourceRef("box", None, 5)
    await lines(svc, "fork", "f5")
    assert notes(boxes, "fork") == [f"c{i}" for i in range(5)] + ["f5"]
    rows = await store.load_journal(calls_run_id("uid-2"))
    [(lost, restored)] = fork_gate.replacements  # one restore: the fresh sandbox replaced from the fork's copy
    assert lost == fresh and restored is not None and restored != source_snapshot
    copies = [r for r in rows if r.op_id == "calls/snapshot/copy-4" and r.status == "completed"]
    assert [r.result["snapshotId"] for r in copies] == [restored]
    assert replayed(rows) == ["c4"]  # only the call after the snapshot, not all five
    # The borrowed one is let go (journaled only): the source still has it, and restores from it after a loss.
    assert all(not c.borrowed for c in SessionState.derive(SESSION, rows).checkpoints)
    assert (await source_checkpoint(store, "uid-1"))[1] == source_snapshot
    box_gate = boxes.gates["box"][1]
    await box_gate.provider.inject_loss(box_gate.handle)
    await lines(svc, "box", "c5")
    assert box_gate.replacements[-1][1] == source_snapshot and notes(boxes, "box")[-2:] == ["c4", "c5"]


class NoCopyProvider(LocalProvider):
    """The local provider without ``snapshot_copy``: a fork cannot own a copy of its source's snapshot."""

    def capabilities(self) -> ProviderCapabilities:
        caps = super().capabilities()
        return caps.model_copy(update={"supported": caps.supported - {Capability.SNAPSHOT_COPY}})


async def test_without_snapshot_copy_or_a_snapshot_the_fork_replays_every_call(tmp_path: Path) -> None:
    boxes, store, svc = await setup(tmp_path, every=2)
    await lines(svc, "box", *(f"c{i}" for i in range(5)))
    _, source_snapshot = await source_checkpoint(store, "uid-1")
    fork_gate = boxes.gates["fork"][1]
    fork_gate.provider = NoCopyProvider(tmp_path / "home")
    boxes.sources["fork"] = SourceRef("box", None, 5)
    await lines(svc, "fork", "f5")
    assert notes(boxes, "fork") == [f"c{i}" for i in range(5)] + ["f5"]
    rows = await store.load_journal(calls_run_id("uid-2"))
    assert fork_gate.replacements == [] and replayed(rows) == [f"c{i}" for i in range(5)]
    assert not [r for r in rows if "copy-" in r.op_id]
    assert all(not c.borrowed for c in SessionState.derive(SESSION, rows).checkpoints)  # let go, never deleted
    assert (await source_checkpoint(store, "uid-1"))[1] == source_snapshot
    boxes.sources["fork2"] = SourceRef("box", None, 3)  # before the source's only snapshot (after 4): replay
    await lines(svc, "fork2", "g3")
    assert notes(boxes, "fork2") == ["c0", "c1", "c2", "g3"] and boxes.gates["fork2"][1].replacements == []


async def delete_sandbox(store: SqliteStore, provider: LocalProvider, uid: str) -> None:
    """What the Sandbox's finalizer does with its session's snapshots (kube/sandbox/finalizer.py)."""
    await delete_session_snapshots(SimpleNamespace(store_for=lambda _ns: store), NAMESPACE, uid,  # type: ignore[arg-type]
                                   provider)


@pytest.mark.parametrize("first", ["box", "fork"])
async def test_deleting_the_source_and_the_fork_in_either_order_deletes_each_snapshot_once(
        tmp_path: Path, first: str) -> None:
    boxes, store, svc = await setup(tmp_path, every=2)
    await lines(svc, "box", *(f"c{i}" for i in range(4)))
    boxes.sources["fork"] = SourceRef("box", None, 4)
    await lines(svc, "fork", "f4")  # 5 calls: no snapshot of its own yet beyond its copy (after 4)
    assert len(snapshot_files(tmp_path)) == 2  # the source's and the fork's copy
    uids = {"box": "uid-1", "fork": "uid-2"}
    provider = boxes.gates["box"][1].provider
    await delete_sandbox(store, provider, uids[first])
    survivor = "fork" if first == "box" else "box"
    assert len(snapshot_files(tmp_path)) == 1
    gate = boxes.gates[survivor][1]  # the other one's snapshot is intact: a loss restores it
    await gate.provider.inject_loss(gate.handle)
    await lines(svc, survivor, "after")
    assert notes(boxes, survivor)[:4] == [f"c{i}" for i in range(4)] and gate.replacements[-1][1] is not None
    await delete_sandbox(store, provider, uids[survivor])
    assert snapshot_files(tmp_path) == set()


class Killed(BaseException):
    """The operator stopping at a fault point (nothing after it runs)."""


async def test_a_fork_stopped_between_its_copy_and_its_record_leaves_no_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boxes, store, svc = await setup(tmp_path, every=2)
    await lines(svc, "box", *(f"c{i}" for i in range(4)))
    boxes.sources["fork"] = SourceRef("box", None, 4)

    def reach(point: str) -> None:
        if point == "snapshot-copied:calls/snapshot/copy-4":
            raise Killed(point)

    monkeypatch.setattr(faults, "reach", reach)
    with pytest.raises(Killed):
        await lines(svc, "fork", "f4")
    assert len(snapshot_files(tmp_path)) == 2  # the copy made, recorded nowhere but its started record
    provider = boxes.gates["box"][1].provider
    await delete_sandbox(store, provider, "uid-2")  # the fork deleted before any other call
    assert len(snapshot_files(tmp_path)) == 1
    await delete_sandbox(store, provider, "uid-1")
    assert snapshot_files(tmp_path) == set()


async def test_a_fork_stopped_after_its_copy_makes_the_same_copy_when_called_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boxes, _, svc = await setup(tmp_path, every=2)
    await lines(svc, "box", *(f"c{i}" for i in range(4)))
    boxes.sources["fork"] = SourceRef("box", None, 4)
    killed = [False]

    def reach(point: str) -> None:
        if point == "snapshot-copied:calls/snapshot/copy-4" and not killed[0]:
            killed[0] = True
            raise Killed(point)

    monkeypatch.setattr(faults, "reach", reach)
    with pytest.raises(Killed):
        await lines(svc, "fork", "f4")
    await lines(svc, "fork", "f4")  # the retry finds the first copy (its operation id), and restores it
    assert notes(boxes, "fork") == ["c0", "c1", "c2", "c3", "f4"]
    assert len(snapshot_files(tmp_path)) == 2 and len(boxes.gates["fork"][1].replacements) == 1


async def test_a_source_snapshot_deleted_before_the_copy_makes_the_fork_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boxes, store, svc = await setup(tmp_path, every=2)
    await lines(svc, "box", *(f"c{i}" for i in range(4)))
    _, source_snapshot = await source_checkpoint(store, "uid-1")
    boxes.sources["fork"] = SourceRef("box", None, 4)
    provider = boxes.gates["fork"][1].provider
    copy = provider.copy_snapshot

    async def deleted_first(snapshot_id: str, *, operation_id: str) -> str:
        await provider.delete_snapshot(source_snapshot)  # the source's owner deleted it just before
        return await copy(snapshot_id, operation_id=operation_id)

    monkeypatch.setattr(provider, "copy_snapshot", deleted_first)
    await lines(svc, "fork", "f4")
    assert notes(boxes, "fork") == ["c0", "c1", "c2", "c3", "f4"]
    rows = await store.load_journal(calls_run_id("uid-2"))
    assert replayed(rows) == ["c0", "c1", "c2", "c3"] and boxes.gates["fork"][1].replacements == []
    await delete_sandbox(store, provider, "uid-2")
    assert snapshot_files(tmp_path) == set()
