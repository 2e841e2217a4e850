"""The operator's side of worker-executed Workflows (spec.worker): planned without importing the entrypoint, the
WaitingForWorker condition, the workers' heartbeats read as a notice, and the worker key it hands a namespace."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
from kubernetes.aio.client import ApiException

from durable_sandbox.engine.builds import BUILD_LABEL as RUN_BUILD_LABEL
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.journal.sealing import namespace_key
from durable_sandbox.kube.journal.worker_key import (
    WORKER_KEY_SECRET,
    WorkerKeyError,
    ensure_worker_key,
    read_worker_key,
)
from durable_sandbox.kube.journal.worker_liveness import (
    BUILD_LABEL,
    QUEUE_LABEL,
    Heartbeat,
    heartbeat_name,
    live_builds,
    live_workers,
)
from durable_sandbox.kube.reporting.status import Extra, Projection, render
from durable_sandbox.kube.spec.models import WORKER_NEEDS_ENTRYPOINT
from durable_sandbox.kube.spec.plan import WorkflowUnavailable, plan_workflow
from durable_sandbox.kube.spec.queued import QueuedWorkflow
from durable_sandbox.kube.workflow.queued_runs import no_build_message, no_worker_message
from tests.builders import workflow_resource
from tests.unit.process_support import eventually

ROOT = b"j" * 32


# ------------------------------------------------------------------------------------------------ spec and plan


def test_a_worker_workflow_is_planned_without_importing_its_entrypoint() -> None:
    wf = workflow_resource(entrypoint="team_code.nowhere:flow", input={"a": 1}, worker={"queue": "agents"})
    plan = plan_workflow(wf, source="team", cluster=True, allowed_modules=[])  # the operator may import nothing
    assert isinstance(plan.definition, QueuedWorkflow)
    assert plan.definition.name == plan.definition.ref == "team_code.nowhere:flow"
    assert plan.worker_queue == "agents" and plan.input == {"a": 1}
    with pytest.raises(WorkflowUnavailable, match="team_code"):  # a worker imports it, and says when it cannot
        plan_workflow(wf, source="team", cluster=True, executing_worker=True)


def test_worker_needs_an_entrypoint_and_a_queue_name() -> None:
    with pytest.raises(pydantic.ValidationError, match="worker needs entrypoint"):
        workflow_resource(toolCalls=[{"type": "shell", "command": "true"}], worker={"queue": "agents"})
    with pytest.raises(pydantic.ValidationError, match="is not a queue name"):
        workflow_resource(entrypoint="a.b:c", worker={"queue": "Agents_1"})
    assert "toolCalls" in WORKER_NEEDS_ENTRYPOINT


# ------------------------------------------------------------------------------------------------ the condition


def _run(status: RunStatus) -> RunRecord:
    return RunRecord(run_id="demo-01234567", workflow="a.b:c", input=None, status=status)


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status["conditions"] if c["type"] == kind), None)


def test_waiting_for_worker_names_the_queue_while_no_worker_is_alive() -> None:
    extra = Extra(worker_queue="agents", no_worker=no_worker_message("team-a", "agents"))
    shown = _condition(render(_run(RunStatus.PENDING), Projection(), extra, run_id="demo-01234567"), "WaitingForWorker")
    assert shown is not None and shown["status"] == "True" and shown["reason"] == "NoWorker"
    assert "'agents'" in shown["message"] and "team-a" in shown["message"] and "dsb worker --kube" in shown["message"]
    alive = Extra(worker_queue="agents", no_worker=None)
    shown = _condition(render(_run(RunStatus.RUNNING), Projection(), alive, run_id="demo-01234567"), "WaitingForWorker")
    assert shown is not None and shown["status"] == "False"
    done = _condition(render(_run(RunStatus.SUCCEEDED), Projection(), extra, run_id="x"), "WaitingForWorker")
    assert done is not None and done["status"] == "False"  # a finished run waits for nothing
    assert _condition(render(_run(RunStatus.PENDING), Projection(), Extra(), run_id="x"), "WaitingForWorker") is None


# ------------------------------------------------------------------------------------------------ heartbeats


def _lease(holder: str | None, renewed: dt.datetime, duration: int = 15) -> Any:
    return SimpleNamespace(spec=SimpleNamespace(holder_identity=holder, renew_time=renewed, lease_duration_seconds=duration))


@dataclass
class FakeCoordination:
    items: list[Any]
    selectors: list[str] = field(default_factory=list)

    async def list_namespaced_lease(self, namespace: str, label_selector: str) -> Any:
        self.selectors.append(label_selector)
        return SimpleNamespace(items=self.items)


async def test_only_fresh_heartbeats_count_as_live_workers() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    coordination = FakeCoordination([
        _lease("w-fresh", now - dt.timedelta(seconds=3)),
        _lease("w-stale", now - dt.timedelta(seconds=60)),
        _lease(None, now),  # released
    ])
    api: Any = SimpleNamespace(coordination=coordination)
    assert await live_workers(api, "team-a", "agents", now) == ["w-fresh"]
    assert coordination.selectors == [f"{QUEUE_LABEL}=agents"]


async def test_heartbeats_say_their_build_and_a_run_pinned_to_a_build_no_live_worker_runs_waits_for_it() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    versioned = Heartbeat(SimpleNamespace(), "team-a", "agents", "w-b", build="v2")._body()  # type: ignore[arg-type]
    assert versioned.metadata is not None and (versioned.metadata.labels or {})[BUILD_LABEL] == "v2"
    unversioned = Heartbeat(SimpleNamespace(), "team-a", "agents", "w-0")._body()  # type: ignore[arg-type]
    assert unversioned.metadata is not None and BUILD_LABEL not in (unversioned.metadata.labels or {})
    lease = _lease("w-b", now)
    lease.metadata = SimpleNamespace(labels={BUILD_LABEL: "v2"})
    api: Any = SimpleNamespace(coordination=FakeCoordination([lease, _lease("w-0", now)]))
    alive = await live_builds(api, "team-a", "agents", now)
    assert alive == {"w-b": "v2", "w-0": None}

    pinned = RunRecord(run_id="demo-01234567", workflow="a.b:c", status=RunStatus.RUNNING,
                       labels={RUN_BUILD_LABEL: "v1"})
    said = no_build_message(pinned, "agents", alive)
    assert said is not None and "pinned to build 'v1'" in said and "unversioned, v2" in said and "auto-upgrade" in said
    assert no_build_message(pinned, "agents", {**alive, "w-a": "v1"}) is None  # a worker of v1 is alive
    assert no_build_message(_run(RunStatus.PENDING), "agents", alive) is None  # not pinned yet
    forged = RunRecord(run_id="x", workflow="a.b:c", status=RunStatus.WAITING, labels={RUN_BUILD_LABEL: "x" * 300})
    said = no_build_message(forged, "agents", alive)
    assert said is not None and "x" * 64 not in said and "unreadable" in said  # a worker's label is not echoed as is


def test_heartbeat_names_are_dns_names_of_the_queue() -> None:
    name = heartbeat_name("agents", "Host_1:123:4.5:abc")
    assert name.startswith("dsb-worker-agents-") and all(c.isalnum() or c in "-." for c in name) and name.islower()


# ------------------------------------------------------------------------------------------------ the worker key


@dataclass
class FakeCore:
    secrets: dict[tuple[str, str], Any] = field(default_factory=dict)
    writes: int = 0
    forbidden: bool = False

    async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        if self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        if (namespace, name) not in self.secrets:
            raise ApiException(status=404, reason="Not Found")
        return self.secrets[(namespace, name)]

    async def create_namespaced_secret(self, namespace: str, body: Any) -> Any:
        self.writes += 1
        self.secrets[(namespace, body.metadata.name)] = body
        return body

    async def replace_namespaced_secret(self, name: str, namespace: str, body: Any) -> Any:
        self.writes += 1
        self.secrets[(namespace, name)] = body
        return body


async def test_the_operator_hands_each_namespace_its_own_key_and_puts_it_back_when_changed() -> None:
    core = FakeCore()
    api: Any = SimpleNamespace(core=core)
    assert await ensure_worker_key(api, "team-a", ROOT)
    assert not await ensure_worker_key(api, "team-a", ROOT)  # already right: no write
    assert await read_worker_key(api, "team-a") == namespace_key(ROOT, "team-a") != ROOT
    secret = core.secrets[("team-a", WORKER_KEY_SECRET)]
    secret.data = {"key": base64.b64encode(b"x" * 32).decode()}  # someone replaced it
    secret.metadata.resource_version = "7"
    assert await ensure_worker_key(api, "team-a", ROOT)
    assert await read_worker_key(api, "team-a") == namespace_key(ROOT, "team-a")
    assert core.writes == 2
    await ensure_worker_key(api, "team-b", ROOT)
    assert await read_worker_key(api, "team-b") != await read_worker_key(api, "team-a")


async def test_a_worker_without_its_key_is_told_what_to_do() -> None:
    api: Any = SimpleNamespace(core=FakeCore())
    with pytest.raises(WorkerKeyError, match=r"spec\.worker"):
        await read_worker_key(api, "team-a")
    with pytest.raises(WorkerKeyError, match="get on it"):
        await read_worker_key(SimpleNamespace(core=FakeCore(forbidden=True)), "team-a")  # type: ignore[arg-type]


async def test_a_worker_waits_for_its_key_until_the_operator_writes_it_and_stops_when_told() -> None:
    import asyncio

    from durable_sandbox.kube.workers.start import wait_for_worker_key

    core = FakeCore()
    api: Any = SimpleNamespace(core=core)
    said: list[str] = []
    waiting = asyncio.create_task(wait_for_worker_key(api, "team-a", asyncio.Event(), interval=0.01, say=said.append))
    await eventually(lambda: said, "the worker to say it waits for its key")
    assert not waiting.done()
    await ensure_worker_key(api, "team-a", ROOT)  # the operator, for the first spec.worker Workflow
    async with asyncio.timeout(10):
        assert await waiting == namespace_key(ROOT, "team-a")
    assert len(said) == 1 and WORKER_KEY_SECRET in said[0]
    stop = asyncio.Event()
    stop.set()
    assert await wait_for_worker_key(SimpleNamespace(core=FakeCore()), "team-b", stop, interval=0.01) is None  # type: ignore[arg-type]
