"""A Workflow whose run continues as new follows its chain (kube/workflow/chain.py) and shows it in status.runs
(kube/reporting/chain_status.py): newest first, bounded, each run's id, how it ended and its times; a link is
followed only where the next run's record names the run before it; the next run's journal is the Workflow's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from durable_sandbox.engine import Engine
from durable_sandbox.engine.continue_as_new import CONTINUED_FROM
from durable_sandbox.engine.records import Commit, RunRecord, RunStatus
from durable_sandbox.kube.reporting.chain_status import CONTINUED_AS_NEW, chain_status
from durable_sandbox.kube.spec.models import WorkflowStatus
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.kube.workflow.chain import chain_owner, move_on, next_in_chain
from durable_sandbox.kube.workflow.observed import ObservedStore
from durable_sandbox.kube.workflow.runs import Runs, RunView
from durable_sandbox.stores import SqliteStore
from tests.unit.composition_flows import counter

UID = "0123456789abcdef"
FIRST = cluster_run_id("roll", UID)


def _run(run_id: str, status: RunStatus, result: Any = None, at: float = 1_700_000_000.0) -> RunRecord:
    return RunRecord(run_id=run_id, workflow="wf", input=None, status=status, result=result, created_at=at,
                     updated_at=at + 5)


def test_status_runs_is_the_chain_newest_first_bounded_with_outcomes_and_times() -> None:
    ended = [_run(f"r~{i}" if i else "r", RunStatus.SUCCEEDED, {"continuedAsNew": f"r~{i + 1}"}, 1_700_000_000.0 + i)
             for i in range(3)]
    current = _run("r~3", RunStatus.RUNNING, at=1_700_000_010.0)
    runs = chain_status(ended, current)
    assert [r["runId"] for r in runs] == ["r~3", "r~2", "r~1", "r"]
    assert [r["outcome"] for r in runs] == ["Running", CONTINUED_AS_NEW, CONTINUED_AS_NEW, CONTINUED_AS_NEW]
    assert runs[0]["finishedAt"] is None and runs[0]["startedAt"] == "2023-11-14T22:13:30Z"
    assert runs[1]["finishedAt"] == "2023-11-14T22:13:27Z"
    assert chain_status([], current) == []  # a run that never continued shows no chain
    assert [r["runId"] for r in chain_status(ended, current, limit=2)] == ["r~3", "r~2"]
    done = replace(current, status=RunStatus.SUCCEEDED, result={"ok": 1})
    assert chain_status(ended, done)[0]["outcome"] == "Succeeded"
    # What the CRD's status schema (generated from the model) accepts.
    shown = WorkflowStatus.model_validate({"runs": runs}).model_dump(mode="json", by_alias=True)["runs"]
    assert shown[0] == {"runId": "r~3", "outcome": "Running", "startedAt": "2023-11-14T22:13:30Z",
                        "finishedAt": None}


async def test_the_view_follows_the_chain_and_is_found_under_the_first_and_current_run(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id="w", lease_ttl=10.0)
    try:
        state = await engine.run(counter, {"log": str(tmp_path / "log"), "rounds": 3}, run_id=FIRST)
        assert state.status == "succeeded" and state.run_id == f"{FIRST}~2"
        runs = Runs()
        view = RunView(namespace="team", name="roll", uid=UID, run_id=FIRST, body={})
        runs.views[FIRST] = view
        runs.secrets[FIRST] = {("s", "k"): "v"}
        run = await store.get_run(FIRST)
        assert run is not None
        while run.status.terminal and (nxt := await next_in_chain(store, run)) is not None:
            move_on(runs, view, run, nxt)
            run = nxt
        assert view.run_id == f"{FIRST}~2" and view.run is not None and view.run.status == RunStatus.SUCCEEDED
        assert set(runs.views) == {FIRST, f"{FIRST}~2"}  # the scheduler's key and the run it is at
        assert runs.secrets[f"{FIRST}~2"] == {("s", "k"): "v"}
        shown = chain_status(view.chain, view.run)
        assert [(r["runId"], r["outcome"]) for r in shown] == [
            (f"{FIRST}~2", "Succeeded"), (f"{FIRST}~1", CONTINUED_AS_NEW), (FIRST, CONTINUED_AS_NEW)]
        runs.forget(FIRST)
        assert runs.views == {} and runs.secrets == {}
    finally:
        await engine.aclose()
        await store.close()


async def test_a_link_whose_next_run_names_another_run_is_not_followed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    try:
        ended = RunRecord(run_id="a", workflow="wf", input=None)
        await store.create_run(ended)
        await store.create_run(RunRecord(run_id="a~1", workflow="wf", input=None, labels={CONTINUED_FROM: "other"}))
        lease = await store.claim("a", "w", 30)
        await store.commit("a", lease.fence, Commit([], run={"status": RunStatus.SUCCEEDED,
                                                              "result": {"continuedAsNew": "a~1"}}))
        run = await store.get_run("a")
        assert run is not None and await next_in_chain(store, run) is None
    finally:
        await store.close()


class _Inner:
    """A store without commit_with_new_run (as the API-server journal): the engine's next run is created apart."""

    def __init__(self) -> None:
        self.created: list[tuple[str, Any]] = []
        self.commits: list[str] = []

    async def create_run(self, run: RunRecord, *, owner: Any = None) -> tuple[RunRecord, bool]:
        self.created.append((run.run_id, owner))
        return run, True

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        self.commits.append(run_id)


async def test_the_next_run_of_a_chain_is_owned_by_the_workflow_and_created_before_the_final_commit() -> None:
    runs = Runs()
    runs.views[FIRST] = RunView(namespace="team", name="roll", uid=UID, run_id=FIRST, body={})
    inner, written = _Inner(), []
    store = ObservedStore(inner, lambda run_id, c, ch: written.append(run_id), owner_of=lambda r: chain_owner(runs, r))
    nxt = RunRecord(run_id=f"{FIRST}~1", workflow="wf", input=None, labels={CONTINUED_FROM: FIRST})
    await store.commit_with_new_run(FIRST, 1, Commit([], run={"status": RunStatus.SUCCEEDED}), nxt)
    assert inner.created == [(f"{FIRST}~1", OwnerRef(name="roll", uid=UID))] and inner.commits == [FIRST]
    assert written == [FIRST]
    # A run whose continued-from is no run served here (or that names none) gets no owner from it.
    await store.create_run(RunRecord(run_id="x~1", workflow="wf", input=None, labels={CONTINUED_FROM: "x"}))
    assert inner.created[-1] == ("x~1", None)


def test_a_parked_workflow_mid_chain_is_woken_by_its_current_runs_id() -> None:
    """A child's end wakes its parent by the parent's run id: mid-chain that is ``<first>~<n>``, while the
    Workflow is parked under its own run id."""
    from types import SimpleNamespace

    from durable_sandbox.kube.workflow.runs import Parked
    from durable_sandbox.kube.workflow.scheduler import Scheduler

    runs = Runs()
    scheduler = Scheduler(SimpleNamespace(runs=runs, settings=None), None)  # type: ignore[arg-type]
    due: list[str] = []
    scheduler._due = due.append  # type: ignore[method-assign]
    runs.parked[FIRST] = Parked("team", "roll", UID, 1, "waiting", "Waiting")
    scheduler.runnable(f"{FIRST}~2")
    scheduler.runnable("someone-else~1")
    assert due == [FIRST]


async def test_a_run_that_continued_as_new_is_never_published_as_the_workflows_end() -> None:
    """Between the old run's final commit and the turn that moves on, the Workflow shows no Succeeded (no status
    write, no Event): kubectl wait --for=condition=Succeeded waits for the chain's end."""
    from types import SimpleNamespace

    from durable_sandbox.kube.workflow.publishing import Publisher
    from durable_sandbox.kube.workflow.settings import OperatorSettings

    offered: list[dict[str, Any]] = []
    emitted: list[Any] = []
    events = SimpleNamespace(away=None, emit=lambda body, event: emitted.append(event))
    publisher = Publisher(None, events, Runs(), OperatorSettings())  # type: ignore[arg-type]
    publisher.emit = lambda body, event, said=False: emitted.append(event)  # type: ignore[method-assign]
    view = RunView(namespace="team", name="roll", uid=UID, run_id=FIRST, body={"metadata": {"name": "roll"}})
    view.writer = SimpleNamespace(offer=offered.append)  # type: ignore[assignment]
    view.run = _run(FIRST, RunStatus.SUCCEEDED, {"continuedAsNew": f"{FIRST}~1"})
    publisher.offer(view)
    assert offered == [] and emitted == []
    move_on(Runs(), view, view.run, _run(f"{FIRST}~1", RunStatus.SUCCEEDED, {"done": True}))
    publisher.offer(view)  # the chain's end: published, with the chain
    assert offered and offered[-1]["phase"] == "Succeeded" and offered[-1]["runId"] == f"{FIRST}~1"
    assert [r["outcome"] for r in offered[-1]["runs"]] == ["Succeeded", CONTINUED_AS_NEW]
