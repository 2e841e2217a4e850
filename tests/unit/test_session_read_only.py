"""Issue 35's write and latency goals: a session call that cannot change the workspace (``read_file``, ``list``) is
journaled at its completion only (one commit instead of two), is never replayed into a rebuilt sandbox (it changed
nothing), and a retry with its operation id still answers from the journal; rewind and fork keep it in the
session's order. And a call's own work does not grow with the session (``sessions/derived.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.engine.store import Commit
from durable_sandbox.providers.contract import SandboxHandle, ToolCall, ToolResult
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes import holdings as holdings_module
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.holdings import holdings
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.sessions.derived import DerivedJournal
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.hold import HoldSettings
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from durable_sandbox.sessions.models import (
    CallRequest,
    Limits,
    ListRequest,
    ReadFileRequest,
    RewindRequest,
    ShellRequest,
    WriteFileRequest,
)
from durable_sandbox.sessions.rebuild import REBUILD
from durable_sandbox.sessions.service import SessionService
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, FakeGate, local_gate, service


class CountingStore(SqliteStore):
    """A SQLite store that counts its journal commits (what an API-server journal pays one write each for)."""

    commits = 0

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        self.commits += 1
        await super().commit(run_id, fence, commit)


class Died(BaseException):
    """The operator process dying while the provider runs a call."""


class CountingProvider(LocalProvider):
    """A LocalProvider that counts what it executes, per operation id, and can die once after running one."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.ran: list[str] = []
        self.die_after: str | None = None

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        result = await super().execute(handle, call)
        self.ran.append(call.operation_id)
        if call.operation_id == self.die_after:
            self.die_after = None
            raise Died
        return result


async def setup(tmp_path: Path, every: int = 0) -> tuple[FakeGate, CountingStore, SessionService, CountingProvider]:
    provider = CountingProvider(tmp_path / "home")
    gate = await local_gate(tmp_path / "home", provider)
    store = CountingStore(tmp_path / "runs.db")
    gate.store, gate.snapshot_every = store, every
    # The rate limit is not what these tests are about: a fast machine sends 20 calls in under a second.
    return gate, store, service(store, gate, limits=Limits(max_calls_per_second=10_000)), provider


async def send(svc: SessionService, *requests: CallRequest) -> list[Any]:
    return [await svc.call("good-token", NAMESPACE, "box", r) for r in requests]


async def rows(store: SqliteStore) -> list[OperationRecord]:
    return await store.load_journal(calls_run_id("uid-1"))


def write(op: str, path: str, contents: str) -> WriteFileRequest:
    return WriteFileRequest(operationId=op, path=path, contents=contents)


async def test_a_read_only_call_commits_once_and_a_changing_call_twice(tmp_path: Path) -> None:
    _, store, svc, _ = await setup(tmp_path)
    await send(svc, write("w0", "f", "zero\n"))  # the first call also opens the session (its attach journaled)
    commits: dict[str, int] = {}
    for request in (write("w1", "f", "one\n"), ReadFileRequest(operationId="r1", path="f"),
                    ListRequest(operationId="l1"), ShellRequest(operationId="s1", command="echo x >> g")):
        before = store.commits
        [answer] = await send(svc, request)
        assert answer.exitCode == 0
        commits[request.operationId] = store.commits - before
    assert commits == {"w1": 2, "r1": 1, "l1": 1, "s1": 2}
    journaled = {op: [r.status for r in await rows(store) if r.op_id == f"{SESSION}/{op}"] for op in commits}
    assert journaled == {"w1": ["started", "completed"], "r1": ["completed"], "l1": ["completed"],
                         "s1": ["started", "completed"]}
    [read] = [r for r in await rows(store) if r.op_id == f"{SESSION}/r1"]
    assert journal.read_only(read) and journal.call_target(read) == "f" and read.meta is not None
    assert read.meta[journal.META_INDEX] == 2  # its place in the session's order, as a started record gives it
    state = SessionState.derive(SESSION, await rows(store))
    assert [state.calls[i][0] for i in sorted(state.calls)] == [f"{SESSION}/{op}" for op in ("w0", *commits)]


async def test_a_retried_read_answers_from_the_journal_without_running_again(tmp_path: Path) -> None:
    gate, _, svc, provider = await setup(tmp_path)
    read = ReadFileRequest(operationId="r", path="f")
    first = (await send(svc, write("w", "f", "before\n"), read))[1]
    await send(svc, write("w2", "f", "after\n"))
    [again] = await send(svc, read)
    assert first.stdout == again.stdout == "before\n" and again.replayed and not first.replayed
    assert provider.ran.count("r") == 1
    with pytest.raises(CallRefused) as reused:  # the same id for another read is still refused
        await send(svc, ReadFileRequest(operationId="r", path="g"))
    assert reused.value.status == 409
    assert (Path(gate.handle.metadata["workspace"]) / "f").read_text() == "after\n"


async def test_a_rebuild_after_a_loss_replays_the_writes_and_never_the_reads(tmp_path: Path) -> None:
    gate, store, svc, provider = await setup(tmp_path, every=3)
    await send(svc, write("a", "f", "a\n"), ReadFileRequest(operationId="r1", path="f"),
               ShellRequest(operationId="b", command="echo b >> f"),  # a snapshot after these 3
               ListRequest(operationId="l1"), ShellRequest(operationId="c", command="echo c >> f"))
    lost = gate.handle
    await gate.provider.inject_loss(lost)
    provider.ran.clear()
    [answer] = await send(svc, ReadFileRequest(operationId="r3", path="f"))
    assert answer.stdout == "a\nb\nc\n" and gate.replacements and gate.replacements[0][0] == lost.id
    assert provider.ran == ["c", "r3"]  # replayed after the snapshot: the write, not the list or the read
    [rebuilt] = [r for r in await rows(store) if r.op_id == f"{REBUILD}/{gate.handle.id}"
                 and r.status == "completed"]
    assert rebuilt.result == {"replayed": ["c"]} and rebuilt.meta == {"sandbox": gate.handle.id, "from": 3, "count": 5}


async def test_a_read_interrupted_by_a_crash_leaves_the_sandbox_known_and_runs_again_when_retried(
        tmp_path: Path) -> None:
    """No started record: the read the operator died under leaves no trace, so the sandbox it ran in is not
    suspected (a changing call's would be replaced and rebuilt) and the retry runs the read there, once more."""
    gate, _, svc, provider = await setup(tmp_path)
    await send(svc, write("w", "f", "x\n"))
    provider.die_after = "r"
    read = ReadFileRequest(operationId="r", path="f")
    with pytest.raises(Died):
        await send(svc, read)
    first = gate.handle
    restarted = service(CountingStore(tmp_path / "runs.db"), gate, worker="w2")
    [answer] = await send(restarted, read)
    assert answer.stdout == "x\n" and not answer.replayed
    assert gate.handle.id == first.id and gate.replacements == []
    assert provider.ran.count("r") == 2 and provider.ran.count("w") == 1


async def test_a_rewind_keeps_or_drops_reads_with_their_place_in_the_order(tmp_path: Path) -> None:
    gate, _, svc, provider = await setup(tmp_path, every=0)
    await send(svc, write("a", "f", "a\n"), ReadFileRequest(operationId="r1", path="f"),
               ShellRequest(operationId="b", command="echo b >> f"), ReadFileRequest(operationId="r2", path="f"))
    provider.ran.clear()
    done = await svc.rewind("good-token", NAMESPACE, "box", RewindRequest(toCall=2))
    assert done.rewound == ["b", "r2"] and provider.ran == ["a"]  # rebuilt from fresh: the write only
    [kept] = await send(svc, ReadFileRequest(operationId="r1", path="f"))
    assert kept.replayed and kept.stdout == "a\n"
    with pytest.raises(CallRefused) as rewound:
        await send(svc, ReadFileRequest(operationId="r2", path="f"))
    assert rewound.value.status == 409
    [now] = await send(svc, ReadFileRequest(operationId="r3", path="f"))
    assert now.stdout == "a\n" and (Path(gate.handle.metadata["workspace"]) / "f").read_text() == "a\n"


async def test_the_folded_journal_says_what_reading_it_from_its_first_row_says(tmp_path: Path) -> None:
    """``sessions/derived.py`` folds the rows as they grow; at every length, the same state and holdings as a
    derivation from the first row (reads, writes, snapshots, a loss and its rebuild, a rewind)."""
    gate, store, svc, _ = await setup(tmp_path, every=2)
    await send(svc, write("a", "f", "a\n"), ReadFileRequest(operationId="r1", path="f"),
               ShellRequest(operationId="b", command="echo b >> f"))
    await gate.provider.inject_loss(gate.handle)
    await send(svc, ListRequest(operationId="l1"), ShellRequest(operationId="c", command="echo c >> f"))
    await svc.rewind("good-token", NAMESPACE, "box", RewindRequest(toCall=3))
    await send(svc, ShellRequest(operationId="d", command="echo d >> f"))
    journal_rows = await rows(store)
    folded = DerivedJournal()
    grown: list[OperationRecord] = []
    for row in journal_rows:
        grown.append(row)
        assert folded.state(grown) == SessionState.derive(SESSION, grown)
        assert folded.holdings(grown) == holdings(grown, SESSION)
    assert folded.view(grown).rewinds == 1 and folded.holdings(grown).held
    assert folded.state(list(grown)) == SessionState.derive(SESSION, grown)  # another list: folded afresh


async def test_a_call_under_a_hold_reads_only_the_rows_added_since_the_last_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The work of a call does not grow with its session: under a hold, no call derives the session's state or
    holdings from the journal's first row (a call used to, five times)."""
    gate, store, _, _ = await setup(tmp_path, every=0)
    svc = service(store, gate, hold=HoldSettings(idle_seconds=60, max_seconds=600),
                  limits=Limits(max_calls_per_second=10_000))  # 22 calls as fast as the machine goes
    await send(svc, write("warm", "f", "x"))
    derived: list[int] = []
    real_derive, real_holdings = SessionState.derive.__func__, holdings_module.holdings  # type: ignore[attr-defined]

    def counting_derive(cls: type[SessionState], sid: str, rows: Any) -> SessionState:
        derived.append(len(rows))
        return real_derive(cls, sid, rows)

    def counting_holdings(rows: Any, sid: str) -> Any:
        derived.append(len(rows))
        return real_holdings(rows, sid)

    monkeypatch.setattr(SessionState, "derive", classmethod(counting_derive))
    monkeypatch.setattr("durable_sandbox.sessions.rebuild.holdings", counting_holdings)
    answers = await send(svc, *(write(f"w{i}", "f", str(i)) for i in range(20)),
                         ReadFileRequest(operationId="r", path="f"))
    assert answers[-1].stdout == "19" and derived == []


async def test_the_timeline_names_what_a_read_read(tmp_path: Path) -> None:
    """A read's completion is its only record, and it says what was read: the web view's label comes from it
    as a changing call's comes from its ``started`` record."""
    from durable_sandbox.ui.timeline import Timeline

    _, store, svc, _ = await setup(tmp_path)
    await send(svc, write("w", "notes.txt", "x"), ReadFileRequest(operationId="r", path="notes.txt"))
    timeline = Timeline(0.0)
    timeline.feed(await rows(store))
    labels = {item.op: item.label for item in timeline.items.values() if item.kind == "call"}
    assert labels == {f"{SESSION}/w": "write_file: notes.txt", f"{SESSION}/r": "read_file: notes.txt"}
