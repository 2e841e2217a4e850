"""Queries and updates on any SQL store: the cases, written once; tests/unit/test_queries_updates.py runs them on
SQLite and tests/postgres/test_queries_updates_postgres.py on PostgreSQL (a subclass gives the ``store`` and the
``location`` a `dsb` process opens it by)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine import Engine, QueryRefused, UpdateConflict, UpdateRefused
from durable_sandbox.engine.errors import LeaseHeld
from durable_sandbox.engine.store import Store
from tests.dsb import dsb
from tests.unit.child_workflow_cases import lines
from tests.unit.query_update_flows import counter

# A live holder on another host: never taken for dead, whatever the pid (engine/owner.py).
OTHER_WORKER = "other-host:1:1:abc"


async def written(store: Store, run_id: str) -> str:
    """Everything the store holds of a run, as text: equal before and after means nothing was written."""
    run = await store.get_run(run_id)
    assert run is not None
    journal = [r.to_json() for r in await store.load_journal(run_id)]
    events = [e.to_json() for e in await store.read_events(run_id)]
    return json.dumps({"run": dataclasses.asdict(run), "journal": journal, "events": events,
                       "signals": await store.get_signals(run_id)}, sort_keys=True, default=str)


def updates_in(journal: list[Any]) -> list[Any]:
    return [r for r in journal if r.kind == "update"]


class QueryUpdateCases:
    location: str

    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        raise NotImplementedError
        yield

    @pytest.fixture
    async def engine(self, store: Store) -> AsyncIterator[Engine]:
        e = Engine(store, worker_id="test-worker", lease_ttl=10.0)
        yield e
        await e.aclose()

    async def waiting(self, engine: Engine, tmp_path: Path, run_id: str = "c", start: int = 5) -> Path:
        log = tmp_path / f"{run_id}.log"
        st = await engine.run(counter, {"log": str(log), "start": start}, run_id=run_id)
        assert st.status == "waiting", st.error
        return log

    # ------------------------------------------------------------------ queries

    async def test_a_query_answers_from_the_replayed_state_and_writes_nothing(
        self, engine: Engine, store: Store, tmp_path: Path
    ) -> None:
        log = await self.waiting(engine, tmp_path)
        await engine.update("c", "add", {"amount": 4}, update_id="u1")
        before = await written(store, "c")
        assert await engine.query("c", "total") == 9
        assert await engine.query("c", "added", 5) == [4]
        assert await written(store, "c") == before
        assert lines(log) == ["first"]  # replaying executed no step

    async def test_a_query_of_a_run_that_never_executed_runs_nothing(
        self, engine: Engine, store: Store, tmp_path: Path
    ) -> None:
        log = tmp_path / "log"
        await engine.create(counter, {"log": str(log), "start": 3}, run_id="p")
        before = await written(store, "p")
        assert await engine.query("p", "total") == 3
        assert await written(store, "p") == before
        assert lines(log) == []  # its first step was not executed: a query stops where the journal ends

    async def test_a_query_neither_waits_for_nor_takes_the_lease_of_a_run_executing_elsewhere(
        self, engine: Engine, store: Store, tmp_path: Path
    ) -> None:
        await self.waiting(engine, tmp_path)
        lease = await store.claim("c", OTHER_WORKER, 60.0)
        assert await asyncio.wait_for(engine.query("c", "total"), 10) == 5
        run = await store.get_run("c")
        assert run is not None and (run.lease_owner, run.fence) == (OTHER_WORKER, lease.fence)

    async def test_a_query_of_a_finished_run_reads_its_final_state(self, engine: Engine, tmp_path: Path) -> None:
        await self.waiting(engine, tmp_path)
        await engine.update("c", "add", {"amount": 2}, update_id="u1")
        await engine.signal("c", "more", None)
        await engine.signal("c", "done", None)
        st = await engine.resume("c")
        assert st.status == "succeeded" and st.result == {"total": 7, "added": [2]}
        assert await engine.query("c", "total") == 7

    async def test_an_unknown_query_or_a_bad_argument_says_why(self, engine: Engine, tmp_path: Path) -> None:
        await self.waiting(engine, tmp_path)
        with pytest.raises(QueryRefused, match=r"no query handler 'nope'.*registers: added, total"):
            await engine.query("c", "nope")
        with pytest.raises(QueryRefused, match=r"input: Input should be a valid integer.*parameter `last: int`"):
            await engine.query("c", "added", "many")

    # ------------------------------------------------------------------ updates

    async def test_an_update_is_journaled_once_and_the_run_goes_on_with_it(
        self, engine: Engine, store: Store, tmp_path: Path
    ) -> None:
        log = await self.waiting(engine, tmp_path)
        first = await engine.update("c", "add", {"amount": 4}, update_id="u1")
        assert (first.result, first.new, first.update_id) == (9, True, "u1")
        again = await engine.update("c", "add", {"amount": 4}, update_id="u1")  # the caller's retry
        assert (again.result, again.new) == (9, False)
        journal = await store.load_journal("c")
        [rec] = updates_in(journal)
        assert (rec.op_id, rec.name, rec.result, rec.meta) == ("update:u1", "add", 9, {"input": {"amount": 4}})
        await engine.signal("c", "more", None)
        st = await engine.resume("c")  # replays the update where it was applied: step "second" sees 9
        assert st.status == "waiting", st.error
        second = next(o for o in st.operations if o.op_id == "second")
        assert second.result == 9
        await engine.update("c", "add", {"amount": 1}, update_id="u2")
        await engine.signal("c", "done", None)
        st = await engine.resume("c")  # every step's recorded input matches: the updates replay in place
        assert st.status == "succeeded", st.error
        assert st.result == {"total": 10, "added": [4, 1]}
        assert lines(log) == ["first", "second"]

    async def test_the_same_update_id_with_another_input_is_a_conflict(self, engine: Engine, tmp_path: Path) -> None:
        await self.waiting(engine, tmp_path)
        await engine.update("c", "add", {"amount": 4}, update_id="u1")
        with pytest.raises(UpdateConflict, match=r"'u1'.*another name or input"):
            await engine.update("c", "add", {"amount": 5}, update_id="u1")
        assert await engine.query("c", "total") == 9

    async def test_a_refused_update_says_why_and_journals_nothing(
        self, engine: Engine, store: Store, tmp_path: Path
    ) -> None:
        await self.waiting(engine, tmp_path)
        before = await written(store, "c")
        cases = [
            ("add", {"amount": 0}, r"input.amount: Input should be greater than 0.*parameter `a: Add`"),
            ("add", {"amount": 13}, r"refused by its validator: 13 is not added here"),
            ("add", None, r"input: Input should be a valid dictionary"),
            ("reset", {"x": 1}, r"takes no input"),
            ("subtract", {"amount": 1}, r"no update handler 'subtract'.*registers: add, reset"),
        ]
        for name, value, why in cases:
            with pytest.raises(UpdateRefused, match=why):
                await engine.update("c", name, value, update_id=f"refused-{name}")
        run = await store.get_run("c")
        assert run is not None
        after = json.loads(await written(store, "c"))
        expected = json.loads(before)
        # The update took and gave back the run's lease (its fence moved on); nothing else changed.
        for doc in (after, expected):
            for field in ("fence", "lease_owner", "lease_expires_at", "updated_at"):
                doc["run"].pop(field)
        assert after == expected
        assert await engine.query("c", "total") == 5

    async def test_a_finished_run_refuses_updates_but_answers_a_retry(self, engine: Engine, tmp_path: Path) -> None:
        await self.waiting(engine, tmp_path)
        await engine.update("c", "add", {"amount": 1}, update_id="u1")
        await engine.cancel("c")
        with pytest.raises(UpdateRefused, match="the run has cancelled; updates go to runs that have not finished"):
            await engine.update("c", "add", {"amount": 1}, update_id="u2")
        retry = await engine.update("c", "add", {"amount": 1}, update_id="u1")
        assert (retry.result, retry.new) == (6, False)

    async def test_an_update_waits_for_a_live_holder_and_says_who_holds_the_run(
        self, engine: Engine, store: Store, tmp_path: Path
    ) -> None:
        await self.waiting(engine, tmp_path)
        await store.claim("c", OTHER_WORKER, 60.0)
        with pytest.raises(LeaseHeld):
            await engine.update("c", "add", {"amount": 1}, update_id="u1", wait=0.3)
        assert updates_in(await store.load_journal("c")) == []

    # ------------------------------------------------------------------ crashes (a process of its own)

    @pytest.mark.parametrize("point", ["before", "after"])
    async def test_an_update_whose_process_is_killed_at_its_commit_is_applied_exactly_once(
        self, engine: Engine, store: Store, tmp_path: Path, point: str
    ) -> None:
        log = await self.waiting(engine, tmp_path)
        killed = dsb("--store", self.location, "update", "c", "add", "--input", '{"amount": 4}', "--id", "k1",
                     fault=f"{point}:update:k1", home=tmp_path / "home")
        assert killed.exit_code == -9, killed.output
        recorded = updates_in(await store.load_journal("c"))
        assert len(recorded) == (1 if point == "after" else 0)  # the commit is the point of no return
        retry = await engine.update("c", "add", {"amount": 4}, update_id="k1")  # the dead holder's lease is taken over
        assert retry.result == 9 and retry.new == (point == "before")
        assert len(updates_in(await store.load_journal("c"))) == 1
        await engine.signal("c", "more", None)
        await engine.signal("c", "done", None)
        st = await engine.resume("c")
        assert st.status == "succeeded", st.error
        assert st.result == {"total": 9, "added": [4]}  # applied once
        assert lines(log) == ["first", "second"]

    async def test_dsb_query_and_update(self, engine: Engine, tmp_path: Path) -> None:
        await self.waiting(engine, tmp_path)
        home = tmp_path / "home"
        up = dsb("--store", self.location, "-o", "json", "update", "c", "add", "--input", '{"amount": 2}',
                 "--id", "cli1", home=home, process=True)
        assert up.exit_code == 0, up.output
        assert json.loads(up.stdout) == {"runId": "c", "update": "add", "updateId": "cli1", "result": 7, "new": True}
        q = dsb("--store", self.location, "query", "c", "added", "--arg", "3", home=home, process=True)
        assert q.exit_code == 0, q.output
        assert json.loads(q.stdout) == [2]
        refused = dsb("--store", self.location, "update", "c", "add", "--input", '{"amount": -1}', home=home,
                      process=True)
        assert refused.exit_code == 2
        assert "error: Update 'add' of run 'c': input.amount: Input should be greater than 0" in refused.stderr
