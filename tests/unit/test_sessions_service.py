"""The session service (sessions/): a Sandbox's own calls journaled by operation id, run once, answered from the
journal on a retry (also by a new process), refused before anything runs when the caller may not call or a
Workflow holds the Sandbox, and bounded per Sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durable_sandbox.sessions.errors import CallRefused
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from durable_sandbox.sessions.models import Limits, ShellRequest, WriteFileRequest
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import NAMESPACE, effects, local_gate, service, service_and_journal, until


def shell(op: str, command: str) -> ShellRequest:
    return ShellRequest(operationId=op, command=command)


async def test_a_retried_call_is_answered_from_the_journal_and_runs_once(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    svc = service(store, gate)
    first = await svc.call("good-token", NAMESPACE, "box", shell("c1", f"echo ran >> {log}; echo out"))
    again = await svc.call("good-token", NAMESPACE, "box", shell("c1", f"echo ran >> {log}; echo out"))
    assert (first.exitCode, first.stdout, first.replayed) == (0, "out\n", False)
    assert (again.exitCode, again.stdout, again.replayed) == (0, "out\n", True)
    assert effects(log) == ["ran"]
    rows = await store.load_journal(calls_run_id("uid-1"))
    # Started before it runs, completed before it is answered (sessions/journal.py).
    assert [(r.op_id, r.status) for r in rows if r.op_id == f"{SESSION}/c1"] == [
        (f"{SESSION}/c1", "started"), (f"{SESSION}/c1", "completed")]


async def test_a_new_process_answers_a_completed_call_from_the_journal(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    first, journal = service_and_journal(store, gate, worker="w1")
    await first.call("good-token", NAMESPACE, "box", shell("c1", f"echo ran >> {log}"))
    await first.call("good-token", NAMESPACE, "box", shell("c2", "echo two"))
    await journal.aclose()  # the process stops: its open session lets go of the lease
    restarted = service(SqliteStore(tmp_path / "runs.db"), gate, worker="w2")
    answer = await restarted.call("good-token", NAMESPACE, "box", shell("c1", f"echo ran >> {log}"))
    assert answer.replayed and effects(log) == ["ran"]
    third = await restarted.call("good-token", NAMESPACE, "box", WriteFileRequest(operationId="c3", path="a.txt", contents="x"))
    assert third.exitCode == 0 and (Path(gate.handle.metadata["workspace"]) / "a.txt").read_text() == "x"
    rows = await SqliteStore(tmp_path / "runs.db").load_journal(calls_run_id("uid-1"))
    indexes = [r.meta["index"] for r in rows if r.status == "completed" and r.op_id.startswith(f"{SESSION}/c")]
    assert indexes == [0, 1, 2]


async def test_an_operation_id_reused_for_another_call_is_refused(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home")
    svc = service(SqliteStore(tmp_path / "runs.db"), gate)
    await svc.call("good-token", NAMESPACE, "box", shell("c1", "echo one"))
    with pytest.raises(CallRefused) as refused:
        await svc.call("good-token", NAMESPACE, "box", shell("c1", "echo two"))
    assert refused.value.status == 409 and "already used for another call" in refused.value.body.what


@pytest.mark.parametrize(("token", "name", "status"), [
    (None, "box", 401), ("forged", "box", 401), ("other-token", "box", 403), ("good-token", "missing", 404)])
async def test_a_refused_caller_runs_nothing(tmp_path: Path, token: str | None, name: str, status: int) -> None:
    log = tmp_path / "effects.log"
    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    with pytest.raises(CallRefused) as refused:
        await service(store, gate).call(token, NAMESPACE, name, shell("c1", f"echo ran >> {log}"))
    assert refused.value.status == status
    assert effects(log) == [] and gate.taken == 0
    assert await store.get_run(calls_run_id("uid-1")) is None


async def test_a_sandbox_held_by_a_workflow_refuses_the_call_with_409(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    gate = await local_gate(tmp_path / "home")
    gate.held_by = "build"
    store = SqliteStore(tmp_path / "runs.db")
    with pytest.raises(CallRefused) as refused:
        await service(store, gate).call("good-token", NAMESPACE, "box", shell("c1", f"echo ran >> {log}"))
    assert refused.value.status == 409 and "'build'" in refused.value.body.what
    assert effects(log) == []
    assert not [r for r in await store.load_journal(calls_run_id("uid-1")) if r.op_id == f"{SESSION}/c1"]


async def test_calls_past_the_bound_per_sandbox_are_refused_with_429(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home")
    gate.let_go = asyncio.Event()
    svc = service(SqliteStore(tmp_path / "runs.db"), gate, limits=Limits(max_concurrent_calls=2))
    first = asyncio.create_task(svc.call("good-token", NAMESPACE, "box", shell("c1", "echo 1")))
    await asyncio.wait_for(gate.in_live.wait(), 30)
    second = asyncio.create_task(svc.call("good-token", NAMESPACE, "box", shell("c2", "echo 2")))
    ref = await gate.find(NAMESPACE, "box")
    await until(lambda: svc.admitted(ref) == 2)  # c2 admitted, waiting for its turn behind c1
    with pytest.raises(CallRefused) as refused:
        await svc.call("good-token", NAMESPACE, "box", shell("c3", "echo 3"))
    assert refused.value.status == 429 and refused.value.body.retry
    gate.let_go.set()
    assert [a.stdout for a in await asyncio.gather(first, second)] == ["1\n", "2\n"]


async def test_a_timeout_over_the_limit_is_refused_before_anything_runs(tmp_path: Path) -> None:
    gate = await local_gate(tmp_path / "home")
    svc = service(SqliteStore(tmp_path / "runs.db"), gate, limits=Limits(max_timeout=10))
    with pytest.raises(CallRefused) as refused:
        await svc.call("good-token", NAMESPACE, "box", ShellRequest(operationId="c1", command="true", timeout=60))
    assert refused.value.status == 400 and "timeout" in refused.value.body.where and gate.taken == 0

