"""Queries and updates on SQLite (the cases: tests/unit/query_update_cases.py), and what only SQLite or one
process shows: the database file's bytes, a run's live state."""

from __future__ import annotations

import asyncio
import shlex
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine import Engine, LeaseHeld, workflow
from durable_sandbox.engine.records import Commit, OperationRecord
from durable_sandbox.engine.store import Store
from durable_sandbox.stores import SqliteStore
from tests.dsb import dsb
from tests.unit.child_workflow_cases import lines
from tests.unit.composition_flows import effect
from tests.unit.query_update_cases import QueryUpdateCases
from tests.unit.query_update_flows import counter


class TestQueriesUpdatesSqlite(QueryUpdateCases):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        self.location = str(tmp_path / "runs.db")
        s = SqliteStore(self.location)
        yield s
        await s.close()


def database_bytes(path: Path) -> str:
    """The whole database as SQL text (every table, every row), read by a connection of its own."""
    db = sqlite3.connect(path)
    try:
        return "\n".join(db.iterdump())
    finally:
        db.close()


async def test_a_query_leaves_the_database_byte_for_byte_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(str(path))
    engine = Engine(store, worker_id="test-worker")
    try:
        st = await engine.run(counter, {"log": str(tmp_path / "log"), "start": 1}, run_id="c")
        assert st.status == "waiting"
        await engine.update("c", "add", {"amount": 2}, update_id="u1")
    finally:
        await engine.aclose()
        await store.close()
    before = database_bytes(path)
    # A process of its own, as a user asks: `dsb query`.
    q = dsb("--store", str(path), "query", "c", "total", home=tmp_path / "home", process=True)
    assert q.exit_code == 0, q.output
    assert q.stdout.strip() == "3"
    assert database_bytes(path) == before


async def test_a_query_of_a_run_executing_here_reads_its_live_state_and_never_blocks_it(tmp_path: Path) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow() -> str:
        entered.set()
        await release.wait()
        return "done"

    @workflow(name="qu-live")
    async def live(ctx: Any) -> int:
        state = {"n": 0}
        ctx.query_handler("n", lambda: state["n"])
        state["n"] = await ctx.step("one", lambda: 1)
        await ctx.step("slow", slow)  # the run is in this step while the query is asked
        state["n"] = 2
        return state["n"]

    store = SqliteStore(str(tmp_path / "runs.db"))
    engine = Engine(store, worker_id="test-worker")
    try:
        run_id = await engine.start(live, run_id="l")
        await asyncio.wait_for(entered.wait(), 30)
        # Answered from the runtime executing the run here (the live state), not by waiting for it.
        assert await asyncio.wait_for(engine.query(run_id, "n"), 5) == 1
        assert not release.is_set() and engine.executor.is_executing(run_id)
        with pytest.raises(LeaseHeld, match="is being executed by"):  # an update waits for the execution, bounded
            await engine.update(run_id, "any", None, update_id="u1", wait=0.2)
        release.set()
        st = await engine.wait(run_id, timeout=30)
        assert st.status == "succeeded" and st.result == 2
    finally:
        await engine.aclose()
        await store.close()


def test_dsb_kube_query_and_update_need_the_call_apis_address(tmp_path: Path) -> None:
    for args in (["query", "r", "total"], ["update", "r", "add", "--input", "{}"]):
        ran = dsb("--kube", *args, home=tmp_path / "home", env={"DSB_SESSION_URL": ""})
        assert ran.exit_code == 2
        assert "with --kube, queries and updates go through the operator's call API" in ran.stderr
        assert "--url or $DSB_SESSION_URL" in ran.stderr


def test_the_query_and_update_commands_of_the_docs(tmp_path: Path) -> None:
    """docs/cli.md's transcript of `dsb query`/`dsb update`, run as written: each command's documented lines are
    what it prints (the run waits: exit 3; the refused update: exit 2)."""
    from tests.docs_commands import ROOT as REPO
    from tests.docs_commands import block_commands, blocks

    [block] = [b for b in blocks(REPO / "docs" / "cli.md") if b.lang == "console" and "dsb query budget-1" in b.body]
    commands = block_commands(block)
    assert [c.text.split()[1] for c in commands] == ["run", "query", "update", "update"]
    codes = []
    for command in commands:
        ran = dsb(*shlex.split(command.text)[1:], home=tmp_path / "home", store=tmp_path / "runs.db")
        codes.append(ran.exit_code)
        for line in command.output:
            assert line in ran.output.splitlines(), (command.text, ran.output)
    assert codes == [3, 0, 0, 2]


async def test_a_query_stops_at_a_started_step_and_at_a_sandbox_without_touching_either(tmp_path: Path) -> None:
    """What the journal does not record as completed is where a read-only replay stops: a step that started (its
    worker died) is not executed again, a sandbox block is not entered (no provider is asked to re-attach)."""
    entered: list[str] = []

    class Sandbox:
        def __init__(self, id: str) -> None:
            self.id = id

        async def __aenter__(self) -> Sandbox:
            entered.append(self.id)
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    @workflow(name="qu-frontier")
    async def frontier(ctx: Any, log: str) -> int:
        state = {"at": "start"}
        ctx.query_handler("at", lambda: state["at"])
        await ctx.step("one", lambda: 1)
        state["at"] = "one"
        await ctx.callback("go")
        state["at"] = "go"
        await ctx.step("two", effect, log, "two")
        state["at"] = "two"
        async with ctx.sandbox("ws"):
            state["at"] = "sandbox"
            await ctx.callback("end")
        return 2

    log = tmp_path / "log"
    db = tmp_path / "runs.db"
    store = SqliteStore(str(db))
    engine = Engine(store, worker_id="test-worker", sandbox_factory=lambda ctx, id, **_: Sandbox(id))

    async def journal(*records: OperationRecord) -> None:  # what a worker of the run (elsewhere) commits
        lease = await store.claim("f", "test-worker", 30.0)
        await store.commit("f", lease.fence, Commit(list(records)))
        await store.release(lease)

    try:
        st = await engine.run(frontier, str(log), run_id="f")
        assert st.status == "waiting" and await engine.query("f", "at") == "one"
        # The run goes on elsewhere and its worker dies inside step "two" (its started record is the journal's last).
        await journal(OperationRecord("go", "callback", "go", "completed", 1, None, True),
                      OperationRecord("two", "step", "effect", "started", 1, None))
        before = database_bytes(db)
        assert await engine.query("f", "at") == "go"
        assert lines(log) == []  # the started step was not executed again
        assert database_bytes(db) == before
        await journal(OperationRecord("two", "step", "effect", "completed", 1, None, "TWO"))
        before = database_bytes(db)
        assert await engine.query("f", "at") == "two"  # the state before the sandbox block
        assert entered == [] and lines(log) == []  # no sandbox entered (no provider asked to re-attach)
        assert database_bytes(db) == before
    finally:
        await engine.aclose()
        await store.close()
