"""``Workflow.spec.forkOf`` (kube/workflow/forking.py) on the local provider and a SQLite store: the fork's run
starts with its source Workflow's first N calls, its sandbox rebuilt at that state (the source's retained snapshot
restored when at or before N, else replayed), then runs its own toolCalls; what is refused, said before anything
is made; a diverging replay leaves nothing. The ``local`` fixture checks at teardown that no sandbox, snapshot or
lease is left."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.spec.models import WorkflowResource
from durable_sandbox.kube.spec.plan import RunPlan, cluster_run_id, plan_workflow
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.kube.workflow.forking import ForkOfBusy, ForkOfRefused, half_made, make_fork
from durable_sandbox.sandboxes import fork_journal
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.stores import SqliteStore
from durable_sandbox.workflows import sandbox_agent
from durable_sandbox.workflows.sandbox_agent import AgentServices
from tests.unit.sandbox_session_support import Hooked, db, engine_for, local

__all__ = ["db", "local"]  # fixtures

SRC_UID = "5a5a5a5a-0000-4000-8000-000000000001"
FORK_UID = "f0f0f0f0-0000-4000-8000-000000000002"
OWNER = OwnerRef(name="try-2", uid=FORK_UID)


@pytest.fixture
async def engine(db: Path, local: Hooked) -> AsyncIterator[durable_sandbox.Engine]:
    env: dict[str, dict[str, str]] = {}
    e = engine_for(db, {"local": local}, extensions=[AgentServices(env_values=lambda run_id: env.get(run_id))])
    e.env = env  # type: ignore[attr-defined]  # the values the operator re-plans, by run id
    owners: dict[str, OwnerRef] = {}
    plain = e.store.create_run

    async def create_run(record: RunRecord, *, owner: OwnerRef | None = None) -> tuple[RunRecord, bool]:
        if owner is not None:
            owners[record.run_id] = owner
        return await plain(record)

    e.store.create_run = create_run  # type: ignore[method-assign,assignment]  # the KubernetesStore's signature
    e.owners = owners  # type: ignore[attr-defined]
    yield e
    await e.aclose()


def workflow(name: str, uid: str, spec: dict[str, Any]) -> WorkflowResource:
    return WorkflowResource.model_validate({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
                                            "metadata": {"name": name, "namespace": "team", "uid": uid},
                                            "spec": spec})


def body(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team", "uid": uid}}


def planned(wf: WorkflowResource) -> RunPlan:
    return plan_workflow(wf, source="team", cluster=True, allowed_modules=[sandbox_agent.__name__])


def counting(n: int, clock_at: int | None = None) -> list[dict[str, Any]]:
    return [{"type": "shell", "command": "date +%s%N" if i == clock_at else f"echo {i} >> log.txt; wc -l < log.txt"}
            for i in range(n)]


async def run_source(engine: durable_sandbox.Engine, calls: int = 12, *, every: int = 5, retain: bool = True,
                     clock_at: int | None = None) -> str:
    plan = planned(workflow("src", SRC_UID, {"toolCalls": counting(calls, clock_at), "sandbox": {"provider": "local"},
                                             "snapshotEveryNCalls": every, "retainLatestSnapshot": retain}))
    assert plan.run_id == cluster_run_id("src", SRC_UID)
    state = await engine.run(plan.definition, plan.input, run_id=plan.run_id)
    assert state.status == "succeeded", state
    return plan.run_id


def fork_plan(after: int, tail: list[dict[str, Any]] | None = None, **spec: Any) -> RunPlan:
    calls = tail or [{"type": "shell", "command": "echo tail >> log.txt"}, {"type": "read_file", "path": "log.txt"}]
    return planned(workflow("try-2", FORK_UID, {"forkOf": {"workflow": "src", "afterCall": after},
                                                "toolCalls": calls, "sandbox": {"provider": "local"}, **spec}))


async def fork(engine: durable_sandbox.Engine, plan: RunPlan, *, source: dict[str, Any] | None = None,
               secrets: dict[tuple[str, str], str] | None = None) -> RunRecord:
    assert plan.run_id is not None
    engine.env[plan.run_id] = plan.env_values  # type: ignore[attr-defined]
    return await make_fork(engine, plan, namespace="team", run_id=plan.run_id, owner=OWNER,
                           source=body("src", SRC_UID) if source is None else source, secrets=secrets or {})


def last_stdout(state: Any) -> str:
    return str(state.result["toolResults"][-1]["stdout"])


@pytest.mark.parametrize(("after", "restored"), [(11, True), (7, False), (0, False), (12, True)])
async def test_a_fork_of_workflow_runs_its_tail_in_the_sources_sandbox_state_after_call_n(
    engine: durable_sandbox.Engine, local: Hooked, after: int, restored: bool
) -> None:
    """The source keeps its newest snapshot (at 10): a fork after 11 or 12 restores it and replays since, one
    after 7 or 0 replays from a fresh sandbox. The fork's run then ends with its own tail's result."""
    src = await run_source(engine)
    plan = fork_plan(after)
    run = await fork(engine, plan)
    assert run.status == RunStatus.PENDING and engine.owners[run.run_id] == OWNER  # type: ignore[attr-defined]
    rows = await engine.history(run.run_id)
    head = rows[0]
    assert head.kind == fork_journal.FORK_OP and head.meta is not None
    assert (head.meta["workflow"], head.meta["uid"], head.meta["source"], head.meta["afterCall"]) == (
        "src", SRC_UID, src, after)
    restores = [r for r in rows if r.op_id.startswith("sandbox/snapshot/borrowed-")]
    assert bool(restores) == restored
    state = await engine.resume(run.run_id)
    assert state.status == "succeeded", state
    assert last_stdout(state) == "".join(f"{i}\n" for i in range(after)) + "tail\n"
    assert len(state.result["toolResults"]) == after + 2
    # The source's retained snapshot is the source's: the fork's run never deletes it.
    src_state = SessionState.derive("sandbox", await engine.history(src))
    assert src_state.retained is not None and src_state.retained not in local.calls("delete_snapshot")
    await engine.delete(run.run_id, force=True)
    await engine.delete(src, force=True)
    await local.delete_snapshot(src_state.retained)  # retained: its owner's to delete (status.latestSnapshot)


async def test_the_forks_env_is_its_own_and_its_tail_env_values_find_their_place(
    engine: durable_sandbox.Engine,
) -> None:
    src = await run_source(engine, calls=4)
    tail = [{"type": "shell", "command": "echo $WHO-$TAILVAR", "env": {"TAILVAR": "t"}}]
    plan = fork_plan(3, tail, sandbox={"provider": "local", "env": [{"name": "WHO", "value": "fork"}]})
    assert plan.env_values == {"sandbox.env.WHO": "fork", "toolCalls[3].env.TAILVAR": "t"}
    run = await fork(engine, plan)
    assert "fork" not in str(run.input) and "t" not in str(run.input["toolCalls"][3].get("env"))  # never stored
    state = await engine.resume(run.run_id)
    assert state.status == "succeeded" and last_stdout(state) == "fork-t\n", state
    await engine.delete(run.run_id, force=True)
    await engine.delete(src, force=True)


async def test_what_a_fork_cannot_start_from_is_refused_before_anything_is_made(
    engine: durable_sandbox.Engine,
) -> None:
    src = await run_source(engine, calls=4)
    with pytest.raises(ForkOfRefused, match=r"afterCall is 5, but Workflow 'src'.s run completed 4") as past:
        await fork(engine, fork_plan(5))
    assert past.value.reason == "ForkPointNotReached"
    with pytest.raises(ForkOfRefused, match=r"does not exist in namespace 'team'") as missing:
        await fork(engine, fork_plan(2), source={})
    assert missing.value.reason == "ForkSourceNotFound"
    # A Workflow of that name made again (another uid) is another Workflow: its run is not the one forked.
    with pytest.raises(ForkOfRefused, match=r"has no run yet") as namesake:
        await fork(engine, fork_plan(2), source=body("src", "99999999-0000-4000-8000-000000000009"))
    assert namesake.value.reason == "ForkSourceNotStarted"
    with pytest.raises(ForkOfRefused, match=r"provider 'local'") as provider:
        await fork(engine, fork_plan(2, sandbox={"provider": "e2b"}))
    assert provider.value.reason == "ForkProviderDiffers"
    assert [r.run_id for r in await engine.runs()] == [src]
    await engine.delete(src, force=True)


async def test_a_diverging_replay_refuses_the_fork_with_expected_and_actual_and_leaves_nothing(
    engine: durable_sandbox.Engine,
) -> None:
    src = await run_source(engine, calls=6, every=0, clock_at=2)
    with pytest.raises(ForkOfRefused, match=r"diverged. Expected .*Actual") as diverged:
        await fork(engine, fork_plan(4))
    assert diverged.value.reason == "ForkDiverged"
    assert [r.run_id for r in await engine.runs()] == [src]  # no run of the fork
    ok = await fork(engine, fork_plan(2))  # before the clock call: nothing to replay that diverges
    await engine.delete(ok.run_id, force=True)
    await engine.delete(src, force=True)


async def test_a_half_made_fork_is_undone_and_made_again(engine: durable_sandbox.Engine) -> None:
    """A maker that died after creating the fork's run (created waiting on nothing, never runnable) leaves a run
    the next admission recognises, undoes and makes again."""
    src = await run_source(engine, calls=4)
    plan = fork_plan(3)
    assert plan.run_id is not None
    left = RunRecord(run_id=plan.run_id, workflow=sandbox_agent.NAME, input=plan.input, status=RunStatus.WAITING)
    await engine.store.create_run(left)
    assert half_made(left)
    run = await make_fork(engine, plan, namespace="team", run_id=plan.run_id, owner=OWNER, source=body("src", SRC_UID),
                          secrets={}, stored=left)
    assert run.status == RunStatus.PENDING and not half_made(run)
    state = await engine.resume(run.run_id)
    assert state.status == "succeeded" and last_stdout(state) == "0\n1\n2\ntail\n"
    await engine.delete(run.run_id, force=True)
    await engine.delete(src, force=True)


async def test_a_fork_another_replica_is_making_is_left_to_it(engine: durable_sandbox.Engine, db: Path,
                                                              local: Hooked) -> None:
    """Two replicas admitting one fork: the second finds the run made (or its lease held while it is made) and
    looks again later (ForkOfBusy, not a refusal), never undoing what the other makes."""
    src = await run_source(engine, calls=4)
    plan = fork_plan(3)
    assert plan.run_id is not None
    run = await fork(engine, plan)
    with pytest.raises(ForkOfBusy, match="another operator replica is making this fork"):
        await fork(engine, plan)  # the run exists: made by the first
    left = RunRecord(run_id="in-the-making", workflow=sandbox_agent.NAME, input=plan.input, status=RunStatus.WAITING)
    await engine.store.create_run(left)
    other = durable_sandbox.Engine(SqliteStore(db), providers={"local": local}, worker_id="other-replica",
                                   lease_ttl=30.0)
    lease = await other.executor.claim(left.run_id)  # its maker (another replica) holds its lease
    with pytest.raises(ForkOfBusy):
        await make_fork(engine, plan, namespace="team", run_id=left.run_id, owner=OWNER, source=body("src", SRC_UID),
                        secrets={}, stored=left)
    assert await engine.store.get_run(left.run_id) is not None  # not undone under its maker
    await other.store.release(lease)
    await other.aclose()
    await engine.delete(left.run_id, force=True)
    state = await engine.resume(run.run_id)
    assert state.status == "succeeded"
    await engine.delete(run.run_id, force=True)
    await engine.delete(src, force=True)
