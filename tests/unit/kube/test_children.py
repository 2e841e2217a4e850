"""Child workflows as Workflow objects (kube/workflow/children.py) and the engine's ``ChildPlacement`` extension
behind them: the child's name, body and ownership, adoption after a crash, refusal of a planted namesake, and the
engine journaling the run id the placement gives (never creating a child twice)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine import Engine
from durable_sandbox.engine.children import PARENT_LABEL, ChildPlacement
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.engine.workflow import definition_of
from durable_sandbox.kube.api.resources import FINALIZER
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.spec.plan import WORKFLOW_LABEL
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.kube.workflow.children import (
    SEAL_ANNOTATION,
    ChildNotAdoptable,
    ChildObjects,
    child_body,
    child_object_name,
    not_adoptable,
)
from durable_sandbox.kube.workflow.runs import Runs, RunView
from durable_sandbox.stores import SqliteStore
from tests.unit.composition_flows import planner, specialist

SPECIALIST = definition_of(specialist)
PARENT = OwnerRef(name="plan", uid="0123456789abcdef")
OP = "work/p0/child"
KEY = b"k" * 32


def record(package: str = "p0") -> RunRecord:
    return RunRecord(run_id="plan-01234567.work.p0.child", workflow=SPECIALIST.name,
                     input={"log": "/x", "package": package}, labels={PARENT_LABEL: "plan-01234567"},
                     workflow_ref=SPECIALIST.ref)


def test_child_name_is_stable_readable_and_short() -> None:
    name = child_object_name("plan", PARENT.uid, "work/p0/child")
    assert name == child_object_name("plan", PARENT.uid, "work/p0/child")  # a replay finds it again
    assert name.startswith("plan-work-p0-child-") and len(name) <= 63
    assert name != child_object_name("plan", "another-uid-0000", "work/p0/child")  # a re-created parent
    assert name != child_object_name("plan", PARENT.uid, "work/p1/child")
    long = child_object_name("p" * 60, PARENT.uid, "x" * 300)
    assert len(long) <= 63 and not long.startswith("-")


def test_child_body_is_owned_finalized_labelled_and_carries_the_program() -> None:
    body = child_body(PARENT, "team", "plan-01234567", "work/p0/child", record())
    meta = body["metadata"]
    assert meta["ownerReferences"] == [{"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
                                        "name": "plan", "uid": PARENT.uid, "controller": True,
                                        "blockOwnerDeletion": True}]
    assert meta["finalizers"] == [FINALIZER]
    assert meta["labels"] == {PARENT_LABEL: "plan"}
    assert body["spec"] == {"entrypoint": SPECIALIST.ref, "input": {"log": "/x", "package": "p0"}}


def test_a_namesake_is_adopted_only_when_it_is_the_child() -> None:
    mine = child_body(PARENT, "team", "plan-01234567", "work/p0/child", record())
    assert not_adoptable(mine, PARENT.uid, record(), OP) is None
    other_owner = copy.deepcopy(mine)
    other_owner["metadata"]["ownerReferences"][0]["uid"] = "ffffffff"
    assert "controlling owner" in str(not_adoptable(other_owner, PARENT.uid, record(), OP))
    no_owner = copy.deepcopy(mine)
    no_owner["metadata"]["ownerReferences"] = []
    assert "controlling owner" in str(not_adoptable(no_owner, PARENT.uid, record(), OP))
    other_input = copy.deepcopy(mine)
    other_input["spec"]["input"]["package"] = "evil"
    assert "spec" in str(not_adoptable(other_input, PARENT.uid, record(), OP))
    more_spec = copy.deepcopy(mine)
    more_spec["spec"]["timeoutSeconds"] = 5
    assert "spec" in str(not_adoptable(more_spec, PARENT.uid, record(), OP))


class FakeObjects:
    """Workflows by name, as the API server keeps them (a uid on create, 409 for a namesake)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.creates = 0

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.creates += 1
        name = body["metadata"]["name"]
        if name in self.items:
            return None
        made = copy.deepcopy(body)
        made["metadata"]["uid"] = f"uid{len(self.items):05d}-0000"
        self.items[name] = made
        return made

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.items.get(name)


class FakeStore:
    def __init__(self) -> None:
        self.runs: dict[str, tuple[RunRecord, OwnerRef | None]] = {}

    async def update_run(self, run_id: str, changes: dict[str, Any]) -> None:
        run, owner = self.runs[run_id]
        self.runs[run_id] = (replace(run, **changes), owner)

    async def get_run(self, run_id: str) -> RunRecord | None:
        found = self.runs.get(run_id)
        return found[0] if found else None

    async def create_run(self, run: RunRecord, *, owner: OwnerRef | None = None) -> tuple[RunRecord, bool]:
        if run.run_id in self.runs:
            return self.runs[run.run_id][0], False
        self.runs[run.run_id] = (run, owner)
        return run, True


def served(runs: Runs) -> None:
    runs.views["plan-01234567"] = RunView(namespace="team", name="plan", uid=PARENT.uid, run_id="plan-01234567",
                                          body={})


async def test_the_child_is_a_workflow_whose_run_it_owns_and_a_replay_adopts_it() -> None:
    objects, store, runs = FakeObjects(), FakeStore(), Runs()
    served(runs)
    children = ChildObjects(objects, runs, lambda ns: store)  # type: ignore[arg-type]
    first = await children.create("team", record(), "plan-01234567", "work/p0/child")
    name = child_object_name("plan", PARENT.uid, "work/p0/child")
    uid = objects.items[name]["metadata"]["uid"]
    assert first.run_id == f"{name}-{uid[:8]}"
    assert first.labels == {PARENT_LABEL: "plan-01234567", WORKFLOW_LABEL: name}
    assert store.runs[first.run_id][1] == OwnerRef(name=name, uid=uid)  # the run goes with its Workflow
    again = await children.create("team", record(), "plan-01234567", "work/p0/child")  # the crash case
    assert again.run_id == first.run_id and len(objects.items) == 1 and len(store.runs) == 1


async def test_a_run_its_own_admission_created_first_learns_its_parent() -> None:
    objects, store, runs = FakeObjects(), FakeStore(), Runs()
    served(runs)
    name = child_object_name("plan", PARENT.uid, "work/p0/child")
    await objects.create("workflows", "team", child_body(PARENT, "team", "plan-01234567", "work/p0/child", record()))
    uid = objects.items[name]["metadata"]["uid"]
    # What the child's admission records (the Workflow's labels, no parent): it may win the race.
    await store.create_run(replace(record(), run_id=f"{name}-{uid[:8]}", labels={WORKFLOW_LABEL: name}))
    children = ChildObjects(objects, runs, lambda ns: store)  # type: ignore[arg-type]
    run = await children.create("team", record(), "plan-01234567", "work/p0/child")
    assert run.labels[PARENT_LABEL] == "plan-01234567"
    assert store.runs[run.run_id][0].labels == {WORKFLOW_LABEL: name, PARENT_LABEL: "plan-01234567"}


async def test_a_planted_namesake_is_refused_and_nothing_of_it_is_taken() -> None:
    objects, store, runs = FakeObjects(), FakeStore(), Runs()
    served(runs)
    planted = child_body(PARENT, "team", "plan-01234567", "work/p0/child", record(package="evil"))
    await objects.create("workflows", "team", planted)
    children = ChildObjects(objects, runs, lambda ns: store)  # type: ignore[arg-type]
    with pytest.raises(ChildNotAdoptable, match="not adopted; delete it"):
        await children.create("team", record(), "plan-01234567", "work/p0/child")
    assert store.runs == {}


def _namesake(seal: str | None) -> dict[str, Any]:
    """What someone who may create Workflows can write before the parent gets there: the child's name, its
    controlling ownerReference to the parent's uid, its very spec, and a seal of their choosing (or none)."""
    body = child_body(PARENT, "team", "plan-01234567", OP, record())
    del body["metadata"]["annotations"][SEAL_ANNOTATION]
    if seal is not None:
        body["metadata"]["annotations"][SEAL_ANNOTATION] = seal
    return body


@pytest.mark.parametrize("seal", [None, "forged", "unsealed"])
async def test_a_precreated_namesake_with_the_childs_owner_and_spec_is_refused_visibly(seal: str | None) -> None:
    """Issue 38's trust note: ownerReference and spec can be written by anyone who may create Workflows; only the
    operator's seal (an HMAC under the journal key, written at creation) makes a namesake adoptable."""
    if seal == "unsealed":  # the digest alone, as an operator without a journal key writes it
        seal = child_body(PARENT, "team", "plan-01234567", OP, record())["metadata"]["annotations"][SEAL_ANNOTATION]
    objects, store, runs = FakeObjects(), FakeStore(), Runs()
    served(runs)
    parent_body = {"metadata": {"name": "plan", "namespace": "team", "uid": PARENT.uid}}
    runs.views["plan-01234567"].body = parent_body
    await objects.create("workflows", "team", _namesake(seal))
    events: list[tuple[Any, LifecycleEvent]] = []
    children = ChildObjects(objects, runs, lambda ns: store, KEY,  # type: ignore[arg-type]
                            lambda body, event: events.append((body, event)))
    with pytest.raises(ChildNotAdoptable, match="does not carry the operator's seal") as refused:
        await children.create("team", record(), "plan-01234567", OP)
    assert "kubectl delete dwf" in str(refused.value)
    assert store.runs == {}  # nothing of it is taken: no run, no result
    assert [(b, e.reason, e.type) for b, e in events] == [(parent_body, "ChildNotAdopted", "Warning")]
    assert "kubectl delete dwf" in events[0][1].message


async def test_a_child_the_operator_sealed_before_a_crash_is_adopted_and_only_under_its_key() -> None:
    objects, store, runs = FakeObjects(), FakeStore(), Runs()
    served(runs)
    made = child_body(PARENT, "team", "plan-01234567", OP, record(), KEY)  # created, then the crash
    assert not_adoptable(made, PARENT.uid, record(), OP, KEY) is None
    assert "seal" in str(not_adoptable(made, PARENT.uid, record(), OP, b"x" * 32))  # another operator's key
    assert "seal" in str(not_adoptable(made, PARENT.uid, record(), "work/p1/child", KEY))  # another operation
    await objects.create("workflows", "team", made)
    children = ChildObjects(objects, runs, lambda ns: store, KEY)  # type: ignore[arg-type]
    run = await children.create("team", record(), "plan-01234567", OP)
    assert run.labels[WORKFLOW_LABEL] == made["metadata"]["name"] and len(objects.items) == 1


async def test_a_run_not_served_here_makes_no_child() -> None:
    objects, store = FakeObjects(), FakeStore()
    children = ChildObjects(objects, Runs(), lambda ns: store)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="no Workflow of namespace team is that run's"):
        await children.create("team", record(), "plan-01234567", "work/p0/child")
    assert objects.creates == 0


async def test_a_child_executed_by_its_parents_process_starts_its_own_children() -> None:
    objects, store, runs = FakeObjects(), FakeStore(), Runs()
    served(runs)
    children = ChildObjects(objects, runs, lambda ns: store)  # type: ignore[arg-type]
    child = await children.create("team", record(), "plan-01234567", "work/p0/child")  # no view of it here
    grandchild = await children.create("team", replace(record(), run_id="g"), child.run_id, "sub")
    owner = objects.items[child.labels[WORKFLOW_LABEL]]["metadata"]
    made = objects.items[grandchild.labels[WORKFLOW_LABEL]]
    assert made["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]
    # A run whose record names a Workflow that is not its own (another uid) starts no child.
    forged = replace(record(), run_id="forged-00000000", labels={WORKFLOW_LABEL: owner["name"]})
    await store.create_run(forged)
    with pytest.raises(RuntimeError, match="is that run's"):
        await children.create("team", replace(record(), run_id="h"), "forged-00000000", "sub")


async def test_the_engine_journals_the_run_id_the_placement_gives(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "runs.db"))
    made: list[str] = []

    async def create(rec: RunRecord, parent: str, op_id: str) -> RunRecord:
        placed = replace(rec, run_id=f"obj-{len(made)}-{op_id.replace('/', '.')}")
        made.append(placed.run_id)
        stored, _ = await store.create_run(placed)
        return stored

    engine = Engine(store, worker_id="w", lease_ttl=10.0, extensions=[ChildPlacement(create)])
    try:
        result = (await engine.run(planner, {"log": str(tmp_path / "log"), "n": 2}, run_id="parent")).result
        assert result["done"] == {"p0": {"package": "p0", "done": "WORK:P0"},
                                  "p1": {"package": "p1", "done": "WORK:P1"}}
        journal = await store.load_journal("parent")
        journaled = sorted(str((r.meta or {}).get("childRunId")) for r in journal if r.kind == "child")
        assert sorted(set(journaled)) == sorted(made) and len(made) == 2
        for run_id in made:
            child = await store.get_run(run_id)
            assert child is not None and child.status.value == "succeeded"
    finally:
        await engine.aclose()
        await store.close()


class RefusingObjects(FakeObjects):
    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        from durable_sandbox.kube.api.client import ApiException

        raise ApiException(status=self.status, reason="test")


async def test_an_api_server_away_stops_the_parent_and_a_refusal_says_what_is_missing() -> None:
    from durable_sandbox.engine.errors import StoreUnavailable

    runs = Runs()
    served(runs)
    away = ChildObjects(RefusingObjects(503), runs, lambda ns: FakeStore())  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):  # a lost lease: the parent resumes from its journal, never fails
        await away.create("team", record(), "plan-01234567", "work/p0/child")
    refused = ChildObjects(RefusingObjects(403), runs, lambda ns: FakeStore())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"needs `create` on workflows\.durable-sandbox\.dev"):
        await refused.create("team", record(), "plan-01234567", "work/p0/child")


async def test_idle_waits_for_the_execution_under_way_here() -> None:
    """What a child's Workflow task waits on while its parent's execution here executes the child."""
    import asyncio

    from durable_sandbox.engine.in_process import ExecutingHere

    here = ExecutingHere()
    await asyncio.wait_for(here.idle("r"), 1)  # nothing under way: at once
    release, entered = asyncio.Event(), asyncio.Event()

    async def executing() -> None:
        async with here.exclusive("r", wait=False):
            entered.set()
            await release.wait()

    task = asyncio.create_task(executing())
    await asyncio.wait_for(entered.wait(), 1)
    waiter = asyncio.create_task(here.idle("r"))
    await asyncio.sleep(0)
    assert not waiter.done()
    release.set()
    await asyncio.wait_for(waiter, 1)
    assert not here.is_executing("r")
    await task


class FakeCluster:
    """What the web view's cluster source reads: Workflows by name, and the namespace's store."""

    namespace = "team"

    def __init__(self, objs: dict[str, dict[str, Any]], store: SqliteStore) -> None:
        self.objs = objs
        self.store = store

    async def workflow(self, ref: str) -> dict[str, Any]:
        return self.objs[ref]


async def test_the_cluster_web_view_links_a_parent_workflow_and_its_child_workflows(tmp_path: Path) -> None:
    from durable_sandbox.ui.cluster import ClusterSource

    store = SqliteStore(str(tmp_path / "runs.db"))
    uid = "abcdef12-0000"

    async def create(rec: RunRecord, parent: str, op_id: str) -> RunRecord:  # as ChildObjects names them
        stored, _ = await store.create_run(replace(rec, run_id=f"plan-{op_id}-{uid[:8]}"))
        return stored

    engine = Engine(store, worker_id="w", lease_ttl=10.0, extensions=[ChildPlacement(create)])
    try:
        await engine.run(planner, {"log": str(tmp_path / "log"), "n": 2}, run_id=f"plan-{PARENT.uid[:8]}")
        child = {"metadata": {"name": "plan-work/p0/child", "uid": uid, "ownerReferences": [
            {**PARENT.to_json(), "controller": True}]}}
        objs = {"plan": {"metadata": {"name": "plan", "uid": PARENT.uid}}, "plan-work/p0/child": child}
        source = ClusterSource(FakeCluster(objs, store))  # type: ignore[arg-type]
        parent = await source.detail("plan")
        assert parent.links == [("child", "plan-work/p0/child"), ("child", "plan-work/p1/child")]
        assert (await source.detail("plan-work/p0/child")).links == [("parent", "plan")]
    finally:
        await engine.aclose()
        await store.close()
