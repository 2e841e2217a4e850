"""Versions in flight (engine/builds.py), on the SQLite store: a run records the build that started it; a worker of
another build leaves it alone (its journal untouched, said with the build it waits for) unless its workflow is
``versioning="auto-upgrade"``, whose ``ctx.patched`` replays the old history down the old path; a run never moves
back to a build it has left. "Deploying a build" is re-registering the workflow name with another function and
giving the engine another ``WorkerBuild``."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from durable_sandbox.engine import Engine, workflow
from durable_sandbox.engine.builds import (
    BUILD_LABEL,
    PAST_BUILDS_LABEL,
    PinnedToBuild,
    WorkerBuild,
    build_from_env,
)
from durable_sandbox.engine.records import Lease, RunRecord
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.engine_support import Crash, ops
from tests.unit.process_support import eventually

CALLS: list[str] = []
DYING: list[bool] = []  # while it holds True, step "two" dies as a killed process would


def one(x: int) -> int:
    CALLS.append("one")
    return x + 1


def two(x: int) -> int:
    CALLS.append("two")
    if DYING:
        raise Crash()
    return x * 10


def new_two(x: int) -> int:
    CALLS.append("new-two")
    return x * 100


@pytest.fixture(autouse=True)
def _calls() -> None:
    CALLS.clear()
    DYING.clear()


@pytest.fixture
async def engines(store: SqliteStore) -> AsyncIterator[dict[str, Engine]]:
    made = {b: Engine(store, worker_id=f"worker-{b}", lease_ttl=10.0, extensions=[WorkerBuild(b)]) for b in "AB"}
    yield made
    for e in made.values():
        await e.aclose()


async def _started_by_a(engines: dict[str, Engine], name: str, run_id: str, versioning: Any = "pinned") -> None:
    """Build A's code: step one, then a step the process dies in (the run is left running, lease free)."""

    @workflow(name=name, versioning=versioning)
    async def v1(ctx: Any, x: int) -> int:
        y = await ctx.step("one", one, x)
        return int(await ctx.step("two", two, y))

    DYING.append(True)
    with pytest.raises(Crash):
        await engines["A"].run(v1, 1, run_id=run_id)
    DYING.clear()
    run = await engines["A"].store.get_run(run_id)
    assert run is not None and run.labels[BUILD_LABEL] == "A" and run.status.value == "running"


async def test_a_run_started_by_build_a_is_left_alone_by_a_worker_of_build_b(
        engines: dict[str, Engine], caplog: pytest.LogCaptureFixture) -> None:
    await _started_by_a(engines, "builds-pinned", "p1")
    before = [(o.op_id, o.status) for o in await engines["A"].history("p1")]

    @workflow(name="builds-pinned")  # build B's code: another second step, not guarded by ctx.patched
    async def v2(ctx: Any, x: int) -> int:
        y = await ctx.step("one", one, x)
        return int(await ctx.step("two", new_two, y))

    fence = (await _run(engines["B"], "p1")).fence
    CALLS.clear()
    assert await engines["B"].worker(idle_exit=True, poll_interval=0.01) == []
    assert CALLS == []  # none of B's code ran for the run
    run = await _run(engines["B"], "p1")
    assert run.status.value == "running" and run.labels[BUILD_LABEL] == "A"
    assert run.fence == fence and run.lease_owner is None  # never claimed: claim_next skips another build's run
    assert [(o.op_id, o.status) for o in await engines["B"].history("p1")] == before

    # Driving it by hand with build B's engine is refused the same way, naming the build.
    with pytest.raises(PinnedToBuild, match="waits for a worker of build 'A'"):
        await engines["B"].resume("p1")

    @workflow(name="builds-pinned")  # build A's code again (its pods still run): it finishes the run
    async def v1_again(ctx: Any, x: int) -> int:
        y = await ctx.step("one", one, x)
        return int(await ctx.step("two", two, y))

    assert await engines["A"].worker(idle_exit=True, poll_interval=0.01) == ["p1"]
    st = await engines["A"].inspect("p1")
    assert st.status == "succeeded" and st.result == 20, st.error
    assert CALLS == ["two"]  # the committed step was replayed, not run again


async def _run(engine: Engine, run_id: str) -> RunRecord:
    run = await engine.store.get_run(run_id)
    assert run is not None, run_id
    return run


class _CountingStore(SqliteStore):
    """The same store file, counting the looks ``claim_next`` took (a condition to wait on, not a sleep)."""

    looks = 0

    async def claim_next(self, *args: Any, **kwargs: Any) -> Lease | None:
        lease = await super().claim_next(*args, **kwargs)
        self.looks += 1
        return lease


@asynccontextmanager
async def _serving(engine: Engine) -> AsyncIterator[asyncio.Task[list[str]]]:
    """``engine``'s worker serving (not exiting when idle) until the block ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(engine.worker(poll_interval=0.01, stop=stop))
    try:
        yield task
    finally:
        stop.set()
        await task


async def test_a_serving_worker_of_another_build_never_holds_the_run_so_its_build_gets_it_at_once(
        engines: dict[str, Engine], store: SqliteStore, caplog: pytest.LogCaptureFixture) -> None:
    # Before claim_next took the build, B's worker claimed the run and held it for a lease (10 s here) while
    # serving: A's worker found nothing to do. Now B never claims it, and A executes it while B still serves.
    await _started_by_a(engines, "builds-held", "h1")
    fence = (await _run(engines["A"], "h1")).fence
    counting = _CountingStore(store.path)
    b = Engine(counting, worker_id="worker-B2", lease_ttl=10.0, extensions=[WorkerBuild("B")])
    caplog.set_level(logging.WARNING, logger="durable_sandbox")
    try:
        async with _serving(b) as serving:
            await eventually(lambda: counting.looks >= 3, "build B's worker looking for runs three times")
            assert (await _run(b, "h1")).fence == fence  # looked, never claimed
            assert await engines["A"].worker(idle_exit=True, poll_interval=0.01) == ["h1"]
        assert await serving == []
        st = await engines["A"].inspect("h1")
        assert st.status == "succeeded" and st.result == 20, st.error
        assert "skips run h1" not in caplog.text  # never claimed, so never refused under a lease either
    finally:
        await b.aclose()
        await counting.close()


async def test_a_run_of_a_workflow_not_imported_yet_is_refused_once_and_given_back_at_once(
        engines: dict[str, Engine], store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # claim_next cannot know the versioning of a workflow this process has not imported: it hands the run out,
    # the executor imports it and refuses (said once), and the claim goes back at once, not after a lease.
    module = f"builds_lazy_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from durable_sandbox.engine import workflow\n\n\n"
        f"@workflow(name={module!r})\nasync def flow(ctx, x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = RunRecord(run_id="lazy1", workflow=module, workflow_ref=f"{module}:flow", input=1,
                    labels={BUILD_LABEL: "A"})
    assert (await store.create_run(run))[1]
    caplog.set_level(logging.WARNING, logger="durable_sandbox")
    async with _serving(engines["B"]) as serving:
        said = await eventually(lambda: "skips run lazy1" in caplog.text, "build B's worker saying it skips lazy1")
        assert said and "pinned to build 'A'" in caplog.text and "this worker runs build 'B'" in caplog.text
        await eventually(lambda: _free(store, "lazy1"), "the claim of lazy1 given back while B still serves")
        assert await engines["A"].worker(idle_exit=True, poll_interval=0.01) == ["lazy1"]
    assert await serving == []
    assert (await engines["A"].inspect("lazy1")).result == 2
    assert caplog.text.count("skips run lazy1") == 1


def _free(store: SqliteStore, run_id: str) -> bool:
    with sqlite3.connect(store.path) as db:
        return db.execute("SELECT lease_owner FROM runs WHERE run_id=?", (run_id,)).fetchone()[0] is None


async def test_auto_upgrade_replays_the_old_history_down_the_old_path_and_moves_the_run(
        engines: dict[str, Engine]) -> None:
    await _started_by_a(engines, "builds-auto", "u1", versioning="auto-upgrade")

    @workflow(name="builds-auto", versioning="auto-upgrade")  # build B: the change guarded by ctx.patched
    async def v2(ctx: Any, x: int) -> int:
        y = await ctx.step("one", one, x)
        if ctx.patched("new-two"):
            return int(await ctx.step("new-two", new_two, y))
        return int(await ctx.step("two", two, y))

    CALLS.clear()
    assert await engines["B"].worker(idle_exit=True, poll_interval=0.01) == ["u1"]
    st = await engines["B"].inspect("u1")
    assert st.status == "succeeded" and st.result == 20  # the old path: its history had reached "two"
    assert CALLS == ["two"]  # "one" replayed from the journal
    marker = ops(st)["patch:new-two"]
    assert marker.result is False
    run = await engines["B"].store.get_run("u1")
    assert run is not None and run.labels[BUILD_LABEL] == "B" and run.labels[PAST_BUILDS_LABEL] == "A"

    # A fresh run of build B takes the new path.
    fresh = await engines["B"].run(v2, 1, run_id="u2")
    assert fresh.status == "succeeded" and fresh.result == 200
    assert ops(fresh)["patch:new-two"].result is True


async def test_a_run_never_moves_back_to_a_build_it_left(engines: dict[str, Engine], store: SqliteStore) -> None:
    await _started_by_a(engines, "builds-back", "m1", versioning="auto-upgrade")
    await store.update_run("m1", {"labels": {BUILD_LABEL: "B", PAST_BUILDS_LABEL: "A"}})  # B took it over

    @workflow(name="builds-back", versioning="auto-upgrade")
    async def v1(ctx: Any, x: int) -> int:
        y = await ctx.step("one", one, x)
        return int(await ctx.step("two", two, y))

    CALLS.clear()
    assert await engines["A"].worker(idle_exit=True, poll_interval=0.01) == []
    assert CALLS == []
    with pytest.raises(PinnedToBuild, match="never moves back to an older build"):
        await engines["A"].resume("m1")


async def test_an_unversioned_engine_neither_records_nor_checks_builds(store: SqliteStore) -> None:
    @workflow(name="builds-none")
    async def wf(ctx: Any, x: int) -> int:
        return int(await ctx.step("one", one, x))

    engine = Engine(store, worker_id="plain", lease_ttl=10.0)
    try:
        st = await engine.run(wf, 1, run_id="n1")
        assert st.status == "succeeded"
        run = await store.get_run("n1")
        assert run is not None and BUILD_LABEL not in run.labels
    finally:
        await engine.aclose()


def test_build_ids_come_from_the_option_else_the_environment_and_must_be_label_values() -> None:
    assert build_from_env("v2", {"DSB_BUILD_ID": "v1"}) == WorkerBuild("v2")
    assert build_from_env(None, {"DSB_BUILD_ID": "v1"}) == WorkerBuild("v1")
    assert build_from_env(None, {}) is None
    with pytest.raises(ValueError, match="1 to 63 letters"):
        WorkerBuild("has space")
    with pytest.raises(ValueError, match="versioning='sometimes'"):
        workflow(name="builds-bad", versioning="sometimes")(_two_args)  # type: ignore[arg-type]


async def _two_args(ctx: Any, x: int) -> int:
    return x


def test_dsb_worker_refuses_a_build_id_that_is_no_label_value(tmp_path: Any) -> None:
    from durable_sandbox.cli.main import cli

    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "s.db"), "worker", "--until-idle", "--build-id", "no/slash"])
    assert result.exit_code == click.UsageError.exit_code, result.output
    assert "--build-id" in result.output and "1 to 63 letters" in result.output


def test_dsb_worker_with_another_build_id_leaves_a_pinned_run_alone(tmp_path: Any) -> None:
    import asyncio

    from durable_sandbox.cli.main import cli

    db = tmp_path / "s.db"

    async def started_by_v1() -> None:
        store = SqliteStore(db)
        engine = Engine(store, worker_id="v1", lease_ttl=10.0, extensions=[WorkerBuild("v1")])
        try:
            run = await engine.create("tests.unit.worker_flows:steps", {"log": str(tmp_path / "log"), "steps": 1},
                                      run_id="cli-pinned")
            await store.update_run(run.run_id, {"labels": {BUILD_LABEL: "v1"}})
        finally:
            await engine.aclose()
            await store.close()

    asyncio.run(started_by_v1())
    result = CliRunner().invoke(cli, ["--store", str(db), "worker", "--until-idle", "--poll-interval", "0.01",
                                      "--build-id", "v2"])
    assert result.exit_code == 0, result.output
    assert "worker executed 0 run(s)" in result.output
    assert not (tmp_path / "log").exists()

    async def left_alone() -> None:
        store = SqliteStore(db)
        try:
            run = await store.get_run("cli-pinned")
            assert run is not None and run.status.value == "pending" and run.lease_owner is None
            assert run.labels[BUILD_LABEL] == "v1"
        finally:
            await store.close()

    asyncio.run(left_alone())
