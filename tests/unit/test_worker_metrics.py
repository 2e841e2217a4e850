"""A worker's metrics (``dsb worker --metrics-port``): a worker in this process on a SQLite store, its /metrics
scraped over HTTP while a run executes; and what each store call tells the metrics
(engine/observed_store.py, kube/telemetry/worker_metrics.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from durable_sandbox.cli.commands.worker_metrics import serving_metrics
from durable_sandbox.engine.builds import BUILD_LABEL, WorkerBuild
from durable_sandbox.engine.errors import LeaseLost, StoreUnavailable
from durable_sandbox.engine.lease_keeper import LeaseKeeper, keep_lease
from durable_sandbox.engine.observed_store import ObservedStore
from durable_sandbox.engine.records import Commit, Lease, RunRecord, RunStatus
from durable_sandbox.engine.runtime import RunRuntime
from durable_sandbox.engine.store import Store
from durable_sandbox.kube.telemetry.worker_metrics import WorkerMetrics
from durable_sandbox.kube.workers.runner import KubeWorker
from durable_sandbox.runs.session import open_engine
from durable_sandbox.runs.settings import Settings
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.stores.sqlite import SqliteStore
from durable_sandbox.testing import SteppedClock
from tests.unit import worker_flows
from tests.unit.kube.kube_worker_support import FakeHeartbeat, FakeObjects, admit, body
from tests.unit.lease_keeper_support import ScriptedRenewals, unavailable

SAMPLE = re.compile(r'^(durable_sandbox_worker_\w+?)(?:_total)?\{([^}]*)\} (\S+)$', re.MULTILINE)


LABEL = re.compile(r'(\w+)="([^"]*)"')
Samples = dict[tuple[str, str], float]


def samples(text: str) -> Samples:
    """``{(metric, labels): value}`` of the worker's counters in an exposition (``_created`` samples left out),
    the labels as ``name="value"`` pairs in name order (what :func:`key` makes)."""
    return {(m, ",".join(f'{k}="{v}"' for k, v in sorted(LABEL.findall(labels)))): float(v)
            for m, labels, v in SAMPLE.findall(text) if not m.endswith("_created")}


def key(metric: str, **labels: str) -> tuple[str, str]:
    return f"durable_sandbox_worker_{metric}", ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        return samples(await resp.text())


LOCAL = {"build": "v7", "queue": ""}


async def test_a_local_worker_s_metrics_move_as_its_run_executes(tmp_path: Path) -> None:
    reached, opened = asyncio.Event(), asyncio.Event()
    worker_flows.GATES["metrics"] = (reached, opened)
    settings = Settings(store=str(tmp_path / "runs.db"))
    build = WorkerBuild("v7")
    async with serving_metrics(0, "127.0.0.1", build=build, queue="") as served, \
            open_engine(settings, create=True, extensions=[build], observer=served.observer) as engine:
        assert served.url is not None
        before = await scrape(served.url)
        assert before[key("runs_claimed", **LOCAL)] == 0
        assert before[key("runs_finished", **LOCAL, outcome="succeeded")] == 0
        run = await engine.create(worker_flows.steps, {"steps": 3, "log": str(tmp_path / "log"), "gate": "metrics"})
        stop = asyncio.Event()
        serving = asyncio.create_task(engine.worker(poll_interval=0.05, stop=stop))
        try:
            await asyncio.wait_for(reached.wait(), 20)
            during = await scrape(served.url)  # step 1 executes (waits for its gate); step 0 is committed
            assert during[key("runs_claimed", **LOCAL)] == 1
            assert during[key("steps_committed", **LOCAL)] == 1
            assert during[key("runs_finished", **LOCAL, outcome="succeeded")] == 0
            opened.set()
            after = await _scrape_until(served.url, key("runs_finished", **LOCAL, outcome="succeeded"), 1)
        finally:
            stop.set()
            await serving
        assert after[key("steps_committed", **LOCAL)] == 3
        assert after[key("runs_finished", **LOCAL, outcome="failed")] == 0
        assert after[key("leases_lost", **LOCAL)] == 0
        assert after[key("lease_renewals_failed", **LOCAL)] == 0
        assert after[key("runs_skipped_pinned", **LOCAL)] == 0
        async with aiohttp.ClientSession() as http, http.get(served.url) as resp:
            assert run.run_id not in await resp.text()  # bounded labels: never a run id
        assert (await engine.client.get(run.run_id)).labels[BUILD_LABEL] == "v7"
    assert _done(tmp_path)  # each step executed once


def _done(tmp_path: Path) -> bool:
    log = tmp_path / "log"
    return log.exists() and log.read_text().split() == ["s0", "s1", "s2"]


async def _scrape_until(url: str, sample: tuple[str, str], value: float) -> Samples:
    """Scrape until ``sample`` reads ``value`` (the final commit lands after the last step's side effect)."""
    seen: dict[str, Samples] = {}

    async def look() -> None:
        seen["last"] = await scrape(url)

    async def reached() -> None:
        while True:
            await look()
            if seen["last"].get(sample) == value:
                return
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(reached(), 20)
    except TimeoutError:
        pytest.fail(f"{sample} never read {value}; last scrape: {seen.get('last')}")
    return seen["last"]


class _Away(SqliteStore):
    """A store whose renewals do not answer (the store away)."""

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        raise StoreUnavailable("the store is away (test)")


async def test_renewals_failed_and_leases_lost_are_told_apart(tmp_path: Path) -> None:
    metrics = WorkerMetrics(build="b", queue="q", process_collectors=False)
    store = ObservedStore(SqliteStore(tmp_path / "runs.db"), metrics)
    away = ObservedStore(_Away(tmp_path / "runs.db"), metrics)
    try:
        await store.create_run(RunRecord(run_id="r1", workflow="wf", input=None))
        mine = await store.claim("r1", "me", 30.0)
        with pytest.raises(StoreUnavailable):
            await away.renew(mine, 30.0)
        await store.inner.release(mine)
        await store.inner.claim("r1", "other", 30.0)  # another worker holds the run now: the fence moved
        with pytest.raises(LeaseLost):
            await store.renew(mine, 30.0)
        with pytest.raises(LeaseLost):  # the execution's last write, refused too: the same lease, not counted again
            await store.commit("r1", mine.fence, Commit([]))
    finally:
        await store.close()
        await away.close()
    got = samples(metrics.generate().decode())
    assert got[key("runs_claimed", build="b", queue="q")] == 0  # a claim alone starts no execution
    assert got[key("lease_renewals_failed", build="b", queue="q")] == 1
    assert got[key("leases_lost", build="b", queue="q")] == 1


async def test_a_cluster_worker_counts_a_run_of_another_build_once_and_one_of_its_build_finishes_it(
        tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    try:
        operator = Engine(store, worker_id="operator", lease_ttl=10.0)
        wf = body("pinned", "4123456789abcdef", tmp_path / "pinned.log")
        plan = await admit(operator, wf)
        assert plan.run_id is not None
        await store.update_run(plan.run_id, {"labels": {**plan.labels, BUILD_LABEL: "v1"}})  # started by build v1
        newer, newer_metrics = _metered_worker(store, wf, "v2")
        for _ in range(2):  # looked at twice, counted once
            assert await newer.serve(asyncio.Event(), until_idle=True) == []
        older, older_metrics = _metered_worker(store, wf, "v1")
        assert await older.serve(asyncio.Event(), until_idle=True) == [plan.run_id]
    finally:
        await store.close()
    v2, v1 = samples(newer_metrics.generate().decode()), samples(older_metrics.generate().decode())
    assert v2[key("runs_skipped_pinned", build="v2", queue="agents")] == 1
    assert v2[key("runs_claimed", build="v2", queue="agents")] == 0
    assert v1[key("runs_skipped_pinned", build="v1", queue="agents")] == 0
    assert v1[key("runs_claimed", build="v1", queue="agents")] == 1
    assert v1[key("steps_committed", build="v1", queue="agents")] == 3
    assert v1[key("runs_finished", build="v1", queue="agents", outcome="succeeded")] == 1


def _metered_worker(store: SqliteStore, wf: dict[str, Any], build: str) -> tuple[KubeWorker, WorkerMetrics]:
    """A cluster worker of ``build`` (queue ``agents``) whose store calls its own metrics are told."""
    metrics = WorkerMetrics(build=build, queue="agents", process_collectors=False)
    engine = Engine(ObservedStore(store, metrics), worker_id=f"w-{build}", lease_ttl=10.0,
                    extensions=[WorkerBuild(build)])
    worker = KubeWorker(engine, FakeObjects([wf]), FakeHeartbeat(), poll=0.05)  # type: ignore[arg-type]
    return worker, metrics


class _Broken:
    """An observer whose every answer raises."""

    def __getattr__(self, name: str) -> Any:
        def fail(*_: object) -> None:
            raise RuntimeError(f"{name} is broken (test)")

        return fail


async def test_an_observer_that_raises_never_fails_a_store_call(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    store = ObservedStore(SqliteStore(tmp_path / "runs.db"), _Broken())
    try:
        await store.create_run(RunRecord(run_id="r1", workflow="wf", input=None))
        lease = await store.claim("r1", "me", 30.0)
        await store.update_run("r1", {"status": RunStatus.RUNNING}, fence=lease.fence)
        await store.update_run("r1", {"status": RunStatus.SUCCEEDED}, fence=lease.fence)
        run = await store.get_run("r1")
        assert run is not None and run.status == "succeeded"
    finally:
        await store.close()
    assert "claimed is broken" in caplog.text and "finished is broken" in caplog.text  # said, not raised


def test_dsb_worker_serves_its_metrics_on_the_port_given_and_says_where(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from durable_sandbox.cli.main import cli

    asyncio.run(SqliteStore(tmp_path / "s.db").close())  # a store to serve
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "s.db"), "worker", "--until-idle",
                                      "--metrics-port", "0", "--build-id", "v3"])
    assert result.exit_code == 0, result.output
    assert re.search(r"worker metrics on http://127\.0\.0\.1:\d+/metrics", result.stderr), result.stderr


async def test_dsb_worker_refuses_a_metrics_port_in_use_naming_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from durable_sandbox.cli.main import cli

    async with serving_metrics(0, "127.0.0.1", build=None, queue="") as taken:
        assert taken.url is not None
        port = taken.url.rsplit(":", 1)[1].split("/")[0]
        result = await asyncio.to_thread(CliRunner().invoke, cli, [
            "--store", str(tmp_path / "s.db"), "worker", "--until-idle", "--metrics-port", port])
    assert result.exit_code == 1, result.output
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr and "--metrics-port" in result.stderr


async def test_a_lease_given_up_past_its_safety_point_counts_as_lost_after_the_renewals_that_failed() -> None:
    metrics = WorkerMetrics(build="b", queue="q", process_collectors=False)
    clock = SteppedClock()
    scripted = ScriptedRenewals(clock, [None], forever=unavailable())  # one renewal succeeds, then the store is away
    store = ObservedStore(cast(Store, scripted), metrics)
    lease = Lease("kept", "worker-a", 7, clock.wall() + 30.0)
    execution: asyncio.Task[bool] = asyncio.create_task(asyncio.Event().wait())
    keeper = LeaseKeeper(store.renew, lease, 30.0, clock, gave_up=store.gave_up)
    await asyncio.wait_for(keep_lease(keeper, store, cast(RunRuntime, object()), execution, lambda: None), 10)
    with pytest.raises(asyncio.CancelledError):
        await execution  # given up: the execution is cancelled
    failed = sum(1 for _, what in scripted.renewals if what == "StoreUnavailable")
    got = samples(metrics.generate().decode())
    assert failed >= 3 and got[key("lease_renewals_failed", build="b", queue="q")] == failed
    assert got[key("leases_lost", build="b", queue="q")] == 1
