"""A replica reads the Workflow afresh before it claims a run and executes it, and never forgets a fresher read.

Found by the chaos soak with API server restarts (seed 15): a replica whose watch had not yet delivered a
``spec.suspend`` (it reconnects after the restart) took over the run of a replica that had died after
acknowledging the suspend in status.observedGeneration, and executed the calls after it: the Workflow
succeeded without ever being Suspended. Now the claim is preceded by one GET; a newer spec wakes the daemon's
next turn instead of being executed past, and a watch event older than what was read is ignored. And a
replica that sees a suspend while another holds the run's lease does not write the suspend's generation as
observed: only the replica that acts on it does."""

from __future__ import annotations

import asyncio
from typing import Any

from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.api.resources import WORKFLOWS
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.workflow.controller import Operator, OperatorSettings
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.turn import acted_generation
from tests import builders
from tests.fakes.custom_objects import FakeCustomObjects

NS, NAME, UID = "team", "nightly", "0b5e1f2a-0000-4000-8000-000000000002"


def workflow(generation: int, **spec: Any) -> dict[str, Any]:
    return builders.workflow(NAME, namespace=NS, uid=UID, generation=generation,
                             status={"phase": "Running", "observedGeneration": 1},
                             **{"toolCalls": [{"type": "shell", "command": "true"}], **spec})


def api_server(current: dict[str, Any] | None) -> FakeCustomObjects:
    """The API server's custom objects: the Workflow is ``current`` (None: 404)."""
    return FakeCustomObjects({(WORKFLOWS, NS, NAME): current} if current is not None else {})


class Api:
    core = None  # no Event is written on this path
    away = ApiServerAway()  # no probe: reports are taken, nothing is said


class Executor:
    """Records the runs it was asked to execute."""

    def __init__(self) -> None:
        self.driven: list[str] = []

    async def drive(self, run_id: str, definition: Any, *, if_busy: str) -> None:
        self.driven.append(run_id)

    def is_executing(self, run_id: str) -> bool:
        return False


class Engine:
    def __init__(self) -> None:
        self.executor = Executor()


class Plan:
    definition = None
    timeout = None


def view_of(body: dict[str, Any]) -> RunView:
    view = RunView(namespace=NS, name=NAME, uid=UID, run_id=cluster_run_id(NAME, UID), body=body)
    view.generation = body["metadata"]["generation"]
    return view


async def drive(current: dict[str, Any] | None, seen: dict[str, Any]) -> tuple[str, RunView, Engine, FakeCustomObjects]:
    custom = api_server(current)
    op = Operator(Api(), settings=OperatorSettings(), objects=custom)  # type: ignore[arg-type]
    engine, view = Engine(), view_of(seen)
    outcome = await asyncio.wait_for(op.execution.drive(view, engine, Plan(), None), 10)  # type: ignore[arg-type]
    return outcome, view, engine, custom


async def test_a_spec_changed_behind_a_lagging_watch_is_not_executed_past() -> None:
    outcome, view, engine, custom = await drive(current=workflow(2, suspend=True), seen=workflow(1))
    assert custom.reads() == 1
    assert engine.executor.driven == [], "the run was claimed and executed on a spec its suspend had replaced"
    assert outcome == "again"
    assert view.wake.is_set() and view.body["metadata"]["generation"] == 2 and view.body["spec"]["suspend"] is True


async def test_an_unchanged_spec_is_executed() -> None:
    outcome, view, engine, custom = await drive(current=workflow(1), seen=workflow(1))
    assert engine.executor.driven == [view.run_id] and custom.reads() == 1
    assert outcome == "again" and not view.wake.is_set()


async def test_a_workflow_gone_behind_a_lagging_watch_ends_its_daemon() -> None:
    outcome, _, engine, _ = await drive(current=None, seen=workflow(1))
    assert engine.executor.driven == [] and outcome == "done"
    replaced = workflow(1)
    replaced["metadata"]["uid"] = "another"
    outcome, _, engine, _ = await drive(current=replaced, seen=workflow(1))
    assert engine.executor.driven == [] and outcome == "done"


def test_a_watch_event_older_than_the_body_held_is_ignored() -> None:
    view = view_of(workflow(1))
    view.notice(workflow(3, suspend=True))
    assert view.wake.is_set()
    view.wake.clear()
    view.generation = 3  # the daemon's next turn acts on it
    view.notice(workflow(2))  # a lagging watch delivers what came before
    assert view.body["metadata"]["generation"] == 3 and view.body["spec"]["suspend"] is True
    assert not view.wake.is_set()
    newer_status = workflow(3, suspend=True)
    newer_status["status"]["phase"] = "Suspended"
    view.notice(newer_status)  # same generation: a status update is taken, without waking the daemon
    assert view.body["status"]["phase"] == "Suspended" and not view.wake.is_set()


def test_a_suspend_waiting_for_the_lease_is_not_reported_as_observed() -> None:
    pending = view_of(workflow(2, suspend=True))
    assert acted_generation(pending) == 1, "would tell the soak (and users) the suspend took effect"
    pending.extra.suspended = True  # suspended by this replica
    assert acted_generation(pending) == 2
    signal = view_of(workflow(2, signals={"approval": True}))
    assert acted_generation(signal) == 2, "a signal is stored by whichever replica sees it"
    for phase in ("Suspended", "Succeeded", "Failed", "Cancelled"):  # nothing left for the suspend to stop
        shown = workflow(3, suspend=True)
        shown["status"]["phase"] = phase
        assert acted_generation(view_of(shown)) == 3, phase
