"""The cluster worker's test fakes: the namespace's Workflows and the worker's heartbeat, a queued Workflow's body,
and what the operator's admission does for it (plan without importing, create the run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_sandbox.kube.spec.plan import RunPlan, plan_workflow
from durable_sandbox.kube.spec.queued import QueuedWorkflow
from durable_sandbox.sandbox_engine import Engine
from tests.builders import workflow, workflow_resource

NS = "team-a"
ENTRYPOINT = "tests.unit.worker_flows:steps"


@dataclass
class FakeObjects:
    bodies: Sequence[Mapping[str, Any]]

    async def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        assert plural == "workflows" and namespace == NS  # a worker reads its own namespace only
        return [dict(b) for b in self.bodies]


@dataclass
class FakeHeartbeat:
    namespace: str = NS
    queue: str = "agents"
    beats: int = 0
    stopped: bool = False

    async def beat(self) -> None:
        self.beats += 1

    async def stop(self) -> None:
        self.stopped = True


def body(name: str, uid: str, log: Path, *, queue: str = "agents", steps: int = 3, gate: str | None = None) -> dict[str, Any]:
    inp: dict[str, Any] = {"log": str(log), "steps": steps}
    if gate is not None:
        inp["gate"] = gate
    return workflow(name, namespace=NS, uid=uid, entrypoint=ENTRYPOINT, input=inp, worker={"queue": queue})


async def admit(engine: Engine, wf_body: dict[str, Any]) -> RunPlan:
    """What the operator's admission does: plan without importing, create the run."""
    wf = workflow_resource(wf_body["metadata"]["name"], namespace=NS, uid=wf_body["metadata"]["uid"],
                           **wf_body["spec"])
    plan = plan_workflow(wf, source=NS, cluster=True, allowed_modules=[])  # no module allowed: nothing imported
    assert isinstance(plan.definition, QueuedWorkflow) and plan.worker_queue == wf_body["spec"]["worker"]["queue"]
    record = engine.client.record(plan.definition, plan.input, run_id=plan.run_id, labels=plan.labels)
    await engine.store.create_run(record)
    return plan
