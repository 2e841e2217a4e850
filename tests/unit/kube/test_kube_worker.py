"""The cluster worker's loop (``kube/workers/runner.py``) over a store it shares with the operator's admission:
it executes only the runs of its queue that the operator admitted (recorded under the entrypoint's name, never
imported by the operator), with the real workflow it imports itself; a stop hands a run over at its next step
boundary and another worker finishes it without running a committed step again. The store here is SQLite: the
Leases and fences are the store protocol's, which the KubernetesStore keeps too (its contract suite)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine import RunStatus
from durable_sandbox.engine.builds import BUILD_LABEL, WorkerBuild
from durable_sandbox.kube.workers.runner import KubeWorker, queued_on
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.stores import SqliteStore
from tests.unit import worker_flows
from tests.unit.kube.kube_worker_support import ENTRYPOINT, NS, FakeHeartbeat, FakeObjects, admit, body
from tests.unit.process_support import eventually


def make_worker(store: SqliteStore, bodies: Sequence[Mapping[str, Any]], worker_id: str, *, build: str | None = None,
                **kw: Any) -> KubeWorker:
    engine = Engine(store, worker_id=worker_id, lease_ttl=10.0, extensions=[WorkerBuild(build)] if build else [])
    return KubeWorker(engine, FakeObjects(bodies), FakeHeartbeat(), poll=0.05, **kw)  # type: ignore[arg-type]


def lines(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


async def test_a_worker_executes_the_admitted_runs_of_its_queue_only(store: SqliteStore, tmp_path: Path) -> None:
    operator = Engine(store, worker_id="operator", lease_ttl=10.0)
    mine, other, unadmitted = (body("mine", "0123456789abcdef", tmp_path / "mine.log"),
                               body("other", "1123456789abcdef", tmp_path / "other.log", queue="billing"),
                               body("later", "2123456789abcdef", tmp_path / "later.log"))
    plan = await admit(operator, mine)
    other_plan = await admit(operator, other)
    worker = make_worker(store, [mine, other, unadmitted], "w1")
    executed = await worker.serve(asyncio.Event(), until_idle=True)
    assert plan.run_id is not None and executed == [plan.run_id]
    run = await operator.client.get(plan.run_id)
    assert run.status == RunStatus.SUCCEEDED and run.result == {"done": [0, 1, 2]}
    assert run.workflow == ENTRYPOINT  # recorded by the operator under the entrypoint's name
    assert lines(tmp_path / "mine.log") == ["s0", "s1", "s2"]
    assert (await operator.client.get(other_plan.run_id or "")).status == RunStatus.PENDING  # another queue's
    assert not (tmp_path / "other.log").exists() and not (tmp_path / "later.log").exists()
    assert worker.heartbeat.stopped and worker.heartbeat.beats >= 1  # type: ignore[attr-defined]
    assert worker.owner_of(plan.run_id) == f"{NS}/0123456789abcdef"  # its sandboxes carry the Workflow's owner tag


async def test_a_worker_of_another_build_never_claims_a_pinned_run_and_one_of_its_build_finishes_it(
        store: SqliteStore, tmp_path: Path) -> None:
    operator = Engine(store, worker_id="operator", lease_ttl=10.0)
    wf = body("pinned", "3123456789abcdef", tmp_path / "pinned.log")
    plan = await admit(operator, wf)
    assert plan.run_id is not None
    await store.update_run(plan.run_id, {"labels": {**plan.labels, BUILD_LABEL: "v1"}})  # started by build v1
    before = await operator.client.get(plan.run_id)
    newer = make_worker(store, [wf], "w-v2", build="v2")
    assert await newer.serve(asyncio.Event(), until_idle=True) == []
    after = await operator.client.get(plan.run_id)
    assert after.fence == before.fence and after.lease_owner is None  # never claimed, not even for a moment
    assert after.status == RunStatus.PENDING and not (tmp_path / "pinned.log").exists()
    assert newer.said_pinned == {plan.run_id}
    same = make_worker(store, [wf], "w-v1", build="v1")
    assert await same.serve(asyncio.Event(), until_idle=True) == [plan.run_id]
    assert (await operator.client.get(plan.run_id)).status == RunStatus.SUCCEEDED
    assert lines(tmp_path / "pinned.log") == ["s0", "s1", "s2"]


def gate(name: str) -> tuple[asyncio.Event, asyncio.Event]:
    worker_flows.GATES[name] = (asyncio.Event(), asyncio.Event())
    return worker_flows.GATES[name]


async def test_a_stopped_worker_hands_over_at_a_step_boundary_and_another_finishes(
        store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    operator = Engine(store, worker_id="operator", lease_ttl=10.0)
    log = tmp_path / "steps.log"
    reached, opened = gate("handed")
    wf = body("handed", "3123456789abcdef", log, steps=4, gate="handed")
    plan = await admit(operator, wf)
    assert plan.run_id is not None
    first, stop = make_worker(store, [wf], "w1", grace=30.0), asyncio.Event()
    ask = first.engine.executor.hand_over

    def hand_over(run_id: str, why: str) -> bool:
        asked = ask(run_id, why)
        opened.set()  # the step in flight finishes (and is committed) only once the handover was asked
        return asked

    monkeypatch.setattr(first.engine.executor, "hand_over", hand_over)
    serving = asyncio.create_task(first.serve(stop))
    async with asyncio.timeout(30):
        await reached.wait()  # step s1 is in flight
    stop.set()  # SIGTERM: hand over at the next boundary
    async with asyncio.timeout(30):
        await serving
    run = await operator.client.get(plan.run_id)
    assert run.status == RunStatus.PENDING, run  # handed over, not finished, not failed
    assert lines(log) == ["s0", "s1"]
    second = make_worker(store, [wf], "w2")
    assert await second.serve(asyncio.Event(), until_idle=True) == [plan.run_id]
    run = await operator.client.get(plan.run_id)
    assert run.status == RunStatus.SUCCEEDED and run.result == {"done": [0, 1, 2, 3]}
    assert lines(log) == ["s0", "s1", "s2", "s3"]  # no committed step ran twice


async def test_a_cancel_the_operator_wrote_is_carried_out_by_the_worker_executing_the_run(
        store: SqliteStore, tmp_path: Path) -> None:
    operator = Engine(store, worker_id="operator", lease_ttl=10.0)
    log = tmp_path / "steps.log"
    reached, _never = gate("cancelled")
    wf = body("cancelled", "4123456789abcdef", log, steps=4, gate="cancelled")
    plan = await admit(operator, wf)
    assert plan.run_id is not None
    worker, stop = make_worker(store, [wf], "w1", grace=30.0), asyncio.Event()
    serving = asyncio.create_task(worker.serve(stop))
    async with asyncio.timeout(30):
        await reached.wait()
    await operator.client.request_cancel(plan.run_id, "spec.cancel is true")  # the operator's steering
    await eventually(lambda: worker.executing and all(t.done() for t in worker.executing.values()),
                     "the worker to carry out the cancel")
    stop.set()
    await serving
    assert (await operator.client.get(plan.run_id)).status == RunStatus.CANCELLED
    assert lines(log) == ["s0", "s1"]


@pytest.mark.parametrize(("spec", "queue", "expected"), [
    ({"worker": {"queue": "agents"}}, "agents", True),
    ({"worker": {"queue": "agents"}}, "billing", False),
    ({}, "agents", False),
])
def test_queued_on(spec: dict[str, Any], queue: str, expected: bool) -> None:
    assert queued_on({"metadata": {"name": "x"}, "spec": spec}, queue) is expected
    assert not queued_on({"metadata": {"name": "x", "deletionTimestamp": "now"}, "spec": spec}, queue)


def test_dsb_worker_queue_needs_kube() -> None:
    from click.testing import CliRunner

    from durable_sandbox.cli.main import cli

    result = CliRunner().invoke(cli, ["worker", "--queue", "agents"])
    assert result.exit_code == 2 and "needs both --kube and --queue" in result.output
