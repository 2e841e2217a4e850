"""Child workflows on any SQL store: the cases, written once; tests/unit/test_child_workflows.py runs them on
SQLite and tests/postgres/test_child_workflows_postgres.py on PostgreSQL (a subclass gives the ``store`` and
the ``location`` a separate process opens it by)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_sandbox.engine import Engine
from durable_sandbox.engine.children import PARENT_LABEL, ChildWorkflowFailed, child_run_id
from durable_sandbox.engine.store import Store
from tests.dsb import dsb
from tests.unit import compose_worker
from tests.unit.composition_flows import one_child, planner, start_then_join
from tests.unit.engine_support import ops

WORKER = Path(compose_worker.__file__)


def lines(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


async def worker(location: str, *args: str, fault: str | None = None) -> tuple[int, str, str]:
    """tests/unit/compose_worker.py in a process of its own (``fault``: the fault point that SIGKILLs it)."""
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_SANDBOX_FAULT"}
    if fault:
        env["DURABLE_SANDBOX_FAULT"] = fault
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), location, *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


class ChildWorkflowCases:
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

    # ------------------------------------------------------------------ results, journal, own runs

    async def test_each_child_is_a_run_of_its_own_journaled_in_the_parent(self, engine: Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        st = await engine.run(planner, {"log": str(log), "n": 3}, run_id="plan")
        assert st.status == "succeeded", st.error
        assert st.result["done"] == {f"p{i}": {"package": f"p{i}", "done": f"WORK:P{i}"} for i in range(3)}
        assert sorted(lines(log)) == sorted(["work:p0", "work:p1", "work:p2", "critic"])
        children = {op.op_id: op for op in st.operations if op.kind == "child"}
        assert set(children) == {f"work/p{i}/child" for i in range(3)}
        for op_id, op in children.items():
            assert op.status == "completed"
            child = await engine.inspect(op.meta["childRunId"])
            assert child.run_id == child_run_id("plan", op_id)
            assert child.status == "succeeded" and child.labels == {PARENT_LABEL: "plan"}
            assert [o.op_id for o in child.operations] == ["work"]  # its own journal
        # Replaying the parent (a resume after it ended) starts nothing again.
        again = await engine.resume("plan")
        assert again.result == st.result and sorted(lines(log)) == sorted(["work:p0", "work:p1", "work:p2", "critic"])

    async def test_start_then_join_with_parallel(self, engine: Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        st = await engine.run(start_then_join, {"log": str(log), "n": 3}, run_id="fan")
        assert st.status == "succeeded", st.error
        assert [r["done"] for r in st.result] == ["WORK:S0", "WORK:S1", "WORK:S2"]
        assert sorted(lines(log)) == ["work:s0", "work:s1", "work:s2"]
        assert ops(st)["join"].status == "completed"
        assert {ops(st)[f"join/{i}"].result["done"] for i in range(3)} == {"WORK:S0", "WORK:S1", "WORK:S2"}
        assert {ops(st)[f"pkg-{i}"].status for i in range(3)} == {"completed"}  # each child's own outcome

    async def test_a_failed_child_is_the_parents_typed_exception_naming_the_child(self, engine: Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        st = await engine.run(one_child, {"log": str(log), "child": {"fail": True}}, run_id="pf")
        assert st.status == "failed"
        assert st.error is not None and st.error["type"] == "ChildWorkflowFailed"
        child_id = child_run_id("pf", "only")
        assert child_id in st.error["message"] and "ValueError" in st.error["message"]
        assert "compose-specialist" in st.error["message"]
        rec = ops(st)["only"]
        assert rec.status == "failed" and rec.error["details"]["childRunId"] == child_id
        with pytest.raises(ChildWorkflowFailed, match=child_id):
            raise ChildWorkflowFailed("only", child_id, "compose-specialist", "failed", "ValueError", "x")

    async def test_a_retried_parent_resumes_its_failed_child_rather_than_starting_another(
        self, engine: Engine, tmp_path: Path
    ) -> None:
        log = tmp_path / "log"
        st = await engine.run(one_child, {"log": str(log), "child": {"fail": True}}, run_id="rp")
        assert st.status == "failed"
        st = await engine.resume("rp")  # the parent's retry: the child is resumed (it fails again: same code)
        assert st.status == "failed"
        child = await engine.inspect(child_run_id("rp", "only"))
        assert child.attempt == 2  # the same child run, retried once
        assert lines(log).count("work:only") == 1  # its completed step was not run again
        assert lines(log).count("fail:only") == 2
        runs = [r.run_id for r in await engine.runs(limit=100)]
        assert sorted(runs) == sorted(["rp", child_run_id("rp", "only")])

    # ------------------------------------------------------------------ waiting children

    async def test_a_waiting_child_makes_the_parent_wait_and_its_end_wakes_the_parent(
        self, engine: Engine, tmp_path: Path
    ) -> None:
        log = tmp_path / "log"
        st = await engine.run(one_child, {"log": str(log), "child": {"wait": True}}, run_id="pw")
        assert st.status == "waiting"
        child_id = child_run_id("pw", "only")
        assert (await engine.inspect(child_id)).status == "waiting"
        await engine.signal(child_id, "approve", "yes")
        assert (await engine.resume(child_id)).status == "succeeded"
        parent = await engine.client.get("pw")
        assert parent.status.value == "pending"  # woken by the child's end, not by a timer
        st = await engine.resume("pw")
        assert st.status == "succeeded", st.error
        assert st.result["child"]["done"] == "WORK:ONLY"
        assert lines(log) == ["before", "work:only", "after"]

    async def test_a_worker_carries_a_waiting_family_to_the_end(self, engine: Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        st = await engine.run(planner, {"log": str(log), "n": 2, "wait": ["p1"]}, run_id="fam")
        assert st.status == "waiting"
        await engine.signal(child_run_id("fam", "work/p1/child"), "approve", True)
        stop = asyncio.Event()
        task = asyncio.create_task(engine.worker(poll_interval=0.02, stop=stop))
        try:
            await engine.client.wait("fam", timeout=60)
            deadline = asyncio.get_running_loop().time() + 60
            while (await engine.client.get("fam")).status.value != "succeeded":
                assert asyncio.get_running_loop().time() < deadline, "the parent never finished"
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await task
        assert sorted(lines(log)) == sorted(["work:p0", "work:p1", "critic"])

    # ------------------------------------------------------------------ cancel

    async def test_a_parents_cancel_cancels_its_children_and_abandon_leaves_them(
        self, engine: Engine, tmp_path: Path
    ) -> None:
        log = tmp_path / "log"
        for policy, expected in (("cancel", "cancelled"), ("abandon", "waiting")):
            run_id = f"pc-{policy}"
            st = await engine.run(one_child, {"log": str(log), "child": {"wait": True}, "policy": policy},
                                  run_id=run_id)
            assert st.status == "waiting"
            st = await engine.cancel(run_id, "no longer needed")
            assert st.status == "cancelled"
            child = await engine.inspect(child_run_id(run_id, "only"))
            assert child.status == expected, (policy, child.status)
            if expected == "cancelled":
                assert child.error is not None and run_id in child.error["message"]

    async def test_a_cancel_reaches_grandchildren(self, engine: Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        st = await engine.run("compose-grandparent", {"log": str(log), "child": {"wait": True}}, run_id="g")
        assert st.status == "waiting"
        await engine.cancel("g", "stop all")
        middle = child_run_id("g", "middle")
        assert (await engine.inspect(middle)).status == "cancelled"
        assert (await engine.inspect(child_run_id(middle, "only"))).status == "cancelled"

    async def test_dsb_run_runs_a_family_and_inspect_shows_the_children(self, engine: Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        ran = dsb("--store", self.location, "-o", "json", "run", "tests.unit.composition_flows:planner",
                  "--input", json.dumps({"log": str(log), "n": 2}), "--run-id", "cli", process=True)
        assert ran.exit_code == 0, ran.output
        assert json.loads(ran.stdout)["status"] == "succeeded"
        assert sorted(lines(log)) == ["critic", "work:p0", "work:p1"]
        shown = dsb("--store", self.location, "-o", "json", "inspect", child_run_id("cli", "work/p0/child"),
                    process=True)
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["labels"] == {PARENT_LABEL: "cli"}

    # ------------------------------------------------------------------ crashes

    @pytest.mark.parametrize("point", ["child-created:only", "child-started:only"])
    async def test_a_crash_around_the_childs_start_never_starts_it_twice(
        self, engine: Engine, tmp_path: Path, point: str
    ) -> None:
        log = tmp_path / "log"
        code, out, err = await worker(self.location, "run", "crash", "compose-one-child", str(log), fault=point)
        assert code == -signal.SIGKILL, (code, out, err)
        child_id = child_run_id("crash", "only")
        assert await engine.store.get_run(child_id) is not None  # the child run exists...
        recorded = "only" in {r.op_id for r in await engine.store.load_journal("crash")}
        assert recorded == (point == "child-started:only")  # ...with or without the parent's record
        code, out, err = await worker(self.location, "resume", "crash")
        assert code == 0, (out, err)
        st = await engine.inspect("crash")
        assert st.status == "succeeded", st.error
        assert lines(log) == ["before", "work:only", "after"]  # the child's work once
        assert sorted(r.run_id for r in await engine.runs(limit=100)) == sorted(["crash", child_id])

    async def test_a_crash_before_the_parent_records_a_childs_failure_never_retries_the_child(
        self, engine: Engine, tmp_path: Path
    ) -> None:
        log = tmp_path / "log"
        extra = json.dumps({"child": {"fail": True}})
        code, out, err = await worker(self.location, "run", "cf", "compose-one-child", str(log), extra,
                                      fault="child-ended:only")
        assert code == -signal.SIGKILL, (code, out, err)
        code, out, err = await worker(self.location, "resume", "cf")
        assert code == 0, (out, err)
        st = await engine.inspect("cf")
        assert st.status == "failed" and st.error is not None and st.error["type"] == "ChildWorkflowFailed"
        child = await engine.inspect(child_run_id("cf", "only"))
        assert child.attempt == 1  # its failure reported, not retried by the parent's resume
        assert lines(log) == ["before", "work:only", "fail:only"]

    async def test_a_crash_inside_the_child_resumes_the_same_child(self, engine: Engine, tmp_path: Path) -> None:
        log = tmp_path / "log"
        code, out, err = await worker(self.location, "run", "inner", "compose-one-child", str(log),
                                      fault="after:work")
        assert code == -signal.SIGKILL, (code, out, err)
        code, out, err = await worker(self.location, "resume", "inner")
        assert code == 0, (out, err)
        st = await engine.inspect("inner")
        assert st.status == "succeeded", st.error
        assert lines(log) == ["before", "work:only", "after"]
