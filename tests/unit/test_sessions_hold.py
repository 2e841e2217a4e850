"""A Sandbox's session kept open while calls keep coming (sessions/hold.py): two journal commits per call, the
holder and the lease taken once per burst and let go after the idle gap; fencing across a lost lease."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine.errors import LeaseHeld
from durable_sandbox.engine.records import Commit, Lease
from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.hold import HoldSettings
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from durable_sandbox.sessions.models import ShellRequest, WriteFileRequest
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, effects, local_gate, service_and_journal, until


class CountingStore(SqliteStore):
    """A SQLite store counting its writes; ``away`` makes renewals fail as if the store were unreachable."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.counts: dict[str, int] = {"commit": 0, "claim": 0, "renew": 0, "release": 0, "load_journal": 0}
        self.away = False

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        self.counts["commit"] += 1
        await super().commit(run_id, fence, commit)

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        self.counts["claim"] += 1
        return await super().claim(run_id, owner, ttl, take_over_from=take_over_from)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        if self.away:
            raise ConnectionError("the store is away (test)")
        self.counts["renew"] += 1
        return await super().renew(lease, ttl)

    async def release(self, lease: Lease) -> None:
        self.counts["release"] += 1
        await super().release(lease)

    async def load_journal(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        self.counts["load_journal"] += 1
        return await super().load_journal(run_id, *args, **kwargs)


def write(op: str) -> WriteFileRequest:
    return WriteFileRequest(operationId=op, path=f"files/{op}.txt", contents=op)


async def test_a_burst_of_calls_takes_the_sandbox_once_and_commits_twice_per_call(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home")
    store = CountingStore(tmp_path / "runs.db")
    svc, journal = service_and_journal(store, gate, hold=HoldSettings(idle_seconds=60, max_seconds=600))
    for i in range(10):
        answer = await svc.call("good-token", NAMESPACE, "box", write(f"c{i}"))
        assert answer.exitCode == 0 and not answer.replayed
    again = await svc.call("good-token", NAMESPACE, "box", write("c3"))
    assert again.replayed
    # The holder taken and the lease claimed once; the journal read once; two commits per call (``started``
    # before it runs, ``completed`` before it is answered), +3 once in the journal's life by its first call: the
    # session's attach record, started and completed, and what the first sandbox holds (``rebuild/<id>``: none).
    assert (gate.taken, gate.released) == (1, 0)
    assert (store.counts["claim"], store.counts["release"], store.counts["load_journal"]) == (1, 0, 1)
    assert store.counts["commit"] == 2 * 10 + 3
    rows = await store.load_journal(calls_run_id("uid-1"))
    calls = [r for r in rows if r.op_id.startswith(f"{SESSION}/c")]
    assert [(r.status, r.meta["index"]) for r in calls] == [
        (status, i) for i in range(10) for status in ("started", "completed")]
    assert all(r.meta["call"]["type"] == "write_file" for r in calls if r.status == "started")
    await journal.aclose()
    assert (gate.released, store.counts["release"], journal.open_sessions()) == (1, 1, 0)


async def test_the_session_is_let_go_after_the_idle_gap_and_another_replica_answers(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    gate = await local_gate(tmp_path / "home")
    store = CountingStore(tmp_path / "runs.db")
    svc, journal = service_and_journal(store, gate, hold=HoldSettings(idle_seconds=0.2))
    await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c1", command=f"echo ran >> {log}"))
    await until(lambda: journal.open_sessions() == 0)
    assert (gate.taken, gate.released, store.counts["release"]) == (1, 1, 1)
    other, other_journal = service_and_journal(SqliteStore(tmp_path / "runs.db"), gate, worker="w2")
    retried = await other.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c1", command=f"echo ran >> {log}"))
    assert retried.replayed and effects(log) == ["ran"]
    await other_journal.aclose()


async def test_a_hold_older_than_its_maximum_is_let_go_after_the_call_and_taken_again(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home")
    store = CountingStore(tmp_path / "runs.db")
    svc, journal = service_and_journal(store, gate, hold=HoldSettings(idle_seconds=60, max_seconds=0.2))
    await svc.call("good-token", NAMESPACE, "box", write("c1"))
    await until(lambda: journal.open_sessions() == 0)  # let go although the idle gap is far off
    await svc.call("good-token", NAMESPACE, "box", write("c2"))
    assert (gate.taken, store.counts["claim"]) == (2, 2)
    await journal.aclose()


async def test_without_a_hold_every_call_lets_go(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home")
    store = CountingStore(tmp_path / "runs.db")
    svc, journal = service_and_journal(store, gate, hold=HoldSettings(idle_seconds=0))
    for i in range(3):
        await svc.call("good-token", NAMESPACE, "box", write(f"c{i}"))
    assert (gate.taken, gate.released, store.counts["claim"], store.counts["release"]) == (3, 3, 3, 3)
    assert journal.open_sessions() == 0


async def test_a_replica_whose_lease_lapsed_runs_nothing_and_writes_nothing(tmp_path: Path) -> None:
    """Replica A's renewals fail (the store away from it): once its last renewal is two thirds of the lease's time
    to live old, A runs no call under its hold; replica B claims the lapsed lease and answers; A's own next call
    claims again and is refused (409, retry) while B holds it: a call never runs in two replicas at once."""
    log = tmp_path / "effects.log"
    gate = await local_gate(tmp_path / "home")
    store_a = CountingStore(tmp_path / "runs.db")
    svc_a, journal_a = service_and_journal(store_a, gate, hold=HoldSettings(idle_seconds=600, max_seconds=600),
                                           lease_ttl=0.6)
    await svc_a.call("good-token", NAMESPACE, "box", write("c1"))
    store_a.away = True
    store_b = SqliteStore(tmp_path / "runs.db")
    svc_b, journal_b = service_and_journal(store_b, gate, worker="w2", hold=HoldSettings(idle_seconds=600, max_seconds=600),
                                           lease_ttl=0.6)
    deadline = asyncio.get_running_loop().time() + 30
    while True:  # B waits (409, retry) until A's lease has lapsed, then answers
        try:
            answer = await svc_b.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c2", command=f"echo b >> {log}"))
            break
        except CallRefused as refused:
            assert refused.status == 409 and refused.body.retry
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
    assert answer.exitCode == 0
    store_a.away = False
    with pytest.raises(CallRefused) as refused:
        await svc_a.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c3", command=f"echo a >> {log}"))
    assert refused.value.status == 409 and refused.value.body.retry
    assert isinstance(refused.value.__cause__, LeaseHeld)
    assert effects(log) == ["b"]
    # A let go of its hold without releasing the Sandbox's session claim: B holds the session now.
    assert (gate.left, gate.released) == (1, 0)
    rows = await store_b.load_journal(calls_run_id("uid-1"))
    assert [r.op_id for r in rows if r.op_id.startswith(f"{SESSION}/c") and r.status == "completed"] == [
        f"{SESSION}/c1", f"{SESSION}/c2"]
    await journal_b.aclose()
    await journal_a.aclose()


class StalledClaimStore(SqliteStore):
    """A SQLite store whose claim of ``stalled``'s call journal waits for ``go`` (a slow API server)."""

    def __init__(self, path: Path, stalled: str) -> None:
        super().__init__(path)
        self.stalled, self.go = stalled, asyncio.Event()
        self.claimed: list[str] = []

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        self.claimed.append(run_id)
        if run_id == self.stalled:
            await self.go.wait()
        return await super().claim(run_id, owner, ttl, take_over_from=take_over_from)


async def test_a_sandbox_whose_session_is_slow_to_open_holds_up_no_other_sandbox(tmp_path: Path) -> None:
    """Sessions of different Sandboxes open side by side; two calls of one Sandbox still open one session."""
    from durable_sandbox.providers.contract import ToolCall
    from durable_sandbox.sessions.journal import SandboxRef

    gate = await local_gate(tmp_path / "home")
    store = StalledClaimStore(tmp_path / "runs.db", calls_run_id("uid-1"))
    _svc, journal = service_and_journal(store, gate, hold=HoldSettings(idle_seconds=60, max_seconds=600))
    slow, other = SandboxRef(NAMESPACE, "box", "uid-1"), SandboxRef(NAMESPACE, "other", "uid-2")

    def call(op: str) -> ToolCall:
        return ToolCall(operation_id=op, type="write_file", args={"path": f"files/{op}.txt", "contents": op})

    first = asyncio.create_task(journal.call(slow, gate, call("s1")))
    second = asyncio.create_task(journal.call(slow, gate, call("s2")))  # waits for the first's opening
    await until(lambda: calls_run_id("uid-1") in store.claimed)
    answered = await asyncio.wait_for(journal.call(other, gate, call("o1")), timeout=20)
    assert answered.result.exit_code == 0 and not first.done() and not second.done()
    store.go.set()
    assert [(await t).result.exit_code for t in (first, second)] == [0, 0]
    assert store.claimed.count(calls_run_id("uid-1")) == 1  # one session for both calls of the slow Sandbox
    assert journal.open_sessions() == 2 and journal._opening == {}  # no opening lock left behind
    await journal.aclose()
