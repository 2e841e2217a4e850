"""Continue-as-new on any SQL store: the cases, written once; tests/unit/test_continue_as_new.py runs them on
SQLite and tests/postgres/test_continue_as_new_postgres.py on PostgreSQL (a subclass gives the ``store`` and
the ``location`` a separate process opens it by). The local provider is watched (``Hooked``): a sandbox is
provisioned once for a whole chain, and at the end nothing of any run is left behind."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.engine.continue_as_new import (
    CHAIN,
    CONTINUED_FROM,
    GENERATION,
    HANDED_OVER_AFTER,
    chain_of,
)
from durable_sandbox.engine.store import Store
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sandboxes.passover import ADOPTED_FROM, PASSED_TO
from tests.dsb import dsb
from tests.unit.child_workflow_cases import lines, worker
from tests.unit.composition_flows import continuing_child_parent, counter, session_agent
from tests.unit.sandbox_session_support import WORKER, Hooked


class ContinueAsNewCases:
    location: str

    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        raise NotImplementedError
        yield

    @pytest.fixture
    def sandbox_home(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        """DURABLE_SANDBOX_HOME of the test and of the processes it starts (the local provider's sandboxes): the
        unit tier's autouse ``home`` does the same, and the PostgreSQL tier has none."""
        path = tmp_path / "dsb-home"
        path.mkdir(exist_ok=True)
        monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(path))
        monkeypatch.delenv("DURABLE_SANDBOX_FAULT", raising=False)
        return path

    @pytest.fixture
    def local(self, sandbox_home: Path) -> Iterator[Hooked]:
        provider = Hooked(LocalProvider(sandbox_home))
        yield provider
        assert provider.inner.leftovers() == [], "the chain left sandboxes, snapshots or leases behind"

    @pytest.fixture
    async def engine(self, store: Store, local: Hooked) -> AsyncIterator[durable_sandbox.Engine]:
        e = durable_sandbox.Engine(store, providers={"local": local}, worker_id=WORKER, lease_ttl=30.0)
        yield e
        await e.aclose()

    async def test_a_chain_of_runs_each_with_its_own_journal(self, engine: durable_sandbox.Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        st = await engine.run(counter, {"log": str(log), "rounds": 4}, run_id="cnt")
        assert st.run_id == "cnt~3" and st.status == "succeeded" and st.result == {"counted": 4}
        assert lines(log) == ["count:0", "count:1", "count:2", "count:3"]
        for gen, run_id in enumerate(["cnt", "cnt~1", "cnt~2", "cnt~3"]):
            state = await engine.inspect(run_id)
            assert [o.op_id for o in state.operations] == ["count"]  # bounded: one run's own operations
            if gen:
                labels = dict(state.labels)
                assert labels.pop(HANDED_OVER_AFTER).isdigit()
                assert labels == {CONTINUED_FROM: "cnt" if gen == 1 else f"cnt~{gen - 1}", CHAIN: "cnt",
                                  GENERATION: str(gen)}
            if gen < 3:
                assert state.status == "succeeded" and state.result == {"continuedAsNew": f"cnt~{gen + 1}"}
        record = await engine.store.get_run("cnt~2")
        assert record is not None
        assert await chain_of(engine.store, record) == (["cnt~1", "cnt"], ["cnt~3"])

    async def test_the_sandbox_passes_over_and_no_call_is_lost(
        self, engine: durable_sandbox.Engine, local: Hooked, tmp_path: Path
    ) -> None:
        st = await engine.run(session_agent, {"total": 10, "per_run": 3}, run_id="ag")
        assert st.status == "succeeded", st.error
        assert st.run_id == "ag~3"
        assert st.result["lines"] == [f"call-{i}" for i in range(10)]  # every call of every run, in order
        assert len(local.calls("provision")) == 1  # no re-provision: the session passed over three times
        first = await engine.history("ag")
        sandbox = next(r.result["id"] for r in first if r.kind == "sandbox.provision" and r.status == "completed")
        assert st.result["sandbox"] == sandbox
        for gen in (1, 2, 3):
            rows = await engine.history(f"ag~{gen}")
            prov = [r for r in rows if r.kind == "sandbox.provision" and r.status == "completed"]
            assert [p.result["id"] for p in prov] == [sandbox]
            assert prov[0].meta[ADOPTED_FROM] == ("ag" if gen == 1 else f"ag~{gen - 1}")
            calls = [r for r in rows if r.kind == "sandbox.call" and r.status == "completed"]
            assert len(calls) <= 4  # bounded: this run's calls only
        passed = [r for r in first if (r.meta or {}).get(PASSED_TO)]
        assert [r.meta[PASSED_TO] for r in passed] == ["ag~1"]

    async def test_with_checkpoints_the_snapshot_passes_too(
        self, engine: durable_sandbox.Engine, local: Hooked, tmp_path: Path
    ) -> None:
        st = await engine.run(session_agent, {"total": 5, "per_run": 3, "snapshot_every": 2}, run_id="sn")
        assert st.status == "succeeded", st.error
        assert st.result["lines"] == [f"call-{i}" for i in range(5)]
        assert len(local.calls("provision")) == 1
        rows = await engine.history("sn~1")
        adopted = [r for r in rows if r.kind == "sandbox.snapshot" and (r.meta or {}).get(ADOPTED_FROM) == "sn"]
        assert len(adopted) == 1 and adopted[0].meta["count"] == 0  # the inherited workspace, at 0 calls

    async def test_a_child_that_continues_as_new_gives_the_parent_its_last_runs_result(
        self, engine: durable_sandbox.Engine, tmp_path: Path
    ) -> None:
        log = tmp_path / "log"
        st = await engine.run(continuing_child_parent, {"log": str(log)}, run_id="pcn")
        assert st.status == "succeeded", st.error
        assert st.result == {"counted": 3}
        assert lines(log) == ["count:0", "count:1", "count:2"]

    async def test_an_input_the_workflow_refuses_fails_the_run_and_passes_nothing(
        self, engine: durable_sandbox.Engine, tmp_path: Path
    ) -> None:
        @durable_sandbox.workflow(name="compose-bad-continue")
        async def bad(ctx: Any, inp: int) -> int:
            await ctx.continue_as_new({"not": "an int"})
            return inp

        st = await engine.run(bad, 1, run_id="bad")
        assert st.status == "failed" and st.error is not None
        assert "continue_as_new of run 'bad'" in st.error["message"]
        assert [r.run_id for r in await engine.runs()] == ["bad"]

    @pytest.mark.parametrize("point", ["after:ws/c1", "passed:ws", "continued-as-new:ck"])
    async def test_a_crash_around_the_hand_over_loses_nothing_and_doubles_nothing(
        self, engine: durable_sandbox.Engine, local: Hooked, tmp_path: Path, point: str
    ) -> None:
        log = tmp_path / "log"
        extra = json.dumps({"total": 6, "per_run": 3})
        code, out, err = await worker(self.location, "run", "ck", "compose-session-agent", str(log), extra,
                                      fault=point)
        assert code == -signal.SIGKILL, (code, out, err)
        # The old run's final commit creates the next run: before it, no next run; after it, both at once.
        runs = {r.run_id: r.status.value for r in await engine.runs()}
        if point == "continued-as-new:ck":
            assert runs == {"ck": "succeeded", "ck~1": "pending"}, runs
        else:
            assert runs == {"ck": "running"}, runs
        code, out, err = await worker(self.location, "resume", "ck")
        assert code == 0, (out, err)
        st = await engine.inspect("ck~1")
        assert st.status == "succeeded", st.error
        assert st.result["lines"] == [f"call-{i}" for i in range(6)], st.result
        assert sorted(r.run_id for r in await engine.runs()) == ["ck", "ck~1"]
        provisions = [r for r in await engine.history("ck") if r.kind == "sandbox.provision" and r.status == "completed"]
        adopted = [r for r in await engine.history("ck~1") if r.kind == "sandbox.provision" and r.status == "completed"]
        assert [r.result["id"] for r in adopted] == [r.result["id"] for r in provisions]  # the same sandbox

    async def test_dsb_inspect_shows_the_chain(self, engine: durable_sandbox.Engine, tmp_path: Path) -> None:
        await engine.run(counter, {"log": str(tmp_path / "log"), "rounds": 3}, run_id="ch")
        shown = dsb("--store", self.location, "inspect", "ch~1", process=True)
        assert shown.exit_code == 0, shown.output
        assert "Continued from" in shown.stdout and "ch (chain ch, generation 1)" in shown.stdout
        assert "Continued as" in shown.stdout and "ch~2" in shown.stdout
