"""Queries and updates of a cluster's Workflows over the call API (sessions/workflow_calls.py, sessions/http.py): the
real KubeAuthorizer against fake TokenReview/SubjectAccessReview APIs (a query needs get on the Workflow, an update
update), the run found from the object's name and uid only, answers and refusals as JSON. The engine is the
operator's kind over a SQLite store here; the cluster's own store is the e2e tier's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from durable_sandbox.client import SandboxCallError, WorkflowClient
from durable_sandbox.engine import Engine
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.sessions.http import create_app, start_session_api
from durable_sandbox.sessions.kube_auth import KubeAuthorizer
from durable_sandbox.sessions.models import Limits
from durable_sandbox.sessions.rates import CallerRates
from durable_sandbox.sessions.workflow_calls import WorkflowCalls
from durable_sandbox.stores.sqlite import SqliteStore
from durable_sandbox.testing import FakeClock
from tests.dsb import dsb
from tests.unit.auth_support import FakeApiServer
from tests.unit.query_update_flows import counter
from tests.unit.sessions_support import local_gate, service

EDITOR = "system:serviceaccount:demo:editor"
VIEWER = "system:serviceaccount:demo:viewer"
URL = "http://sessions/v1/namespaces/demo/workflows/wf"
UID = "0a1b2c3d-0000-4000-8000-000000000001"


class Rbac(FakeApiServer):
    """Allows (user, verb) pairs on workflows/wf in demo; records what it was asked."""

    def __init__(self) -> None:
        super().__init__(tokens={"t-editor": EDITOR, "t-viewer": VIEWER})
        self.grants = {(EDITOR, "get"), (EDITOR, "update"), (VIEWER, "get")}

    async def create_subject_access_review(self, body: Any) -> Any:
        self.asked.append(body)
        a = body.spec.resource_attributes
        ok = (a.group, a.resource, a.namespace, a.name) == ("durable-sandbox.dev", "workflows", "demo", "wf") and (
            body.spec.user, a.verb) in self.grants
        return SimpleNamespace(status=SimpleNamespace(allowed=ok))


def calls_of(engine: Engine, rbac: Rbac) -> WorkflowCalls:
    objects = {("workflows", "demo", "wf"): {"metadata": {"name": "wf", "namespace": "demo", "uid": UID,
                                                           "labels": {"durable-sandbox.dev/run-id": "elsewhere"}},
                                              "status": {"runId": "elsewhere"}}}

    async def read(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return objects.get((plural, namespace, name))

    return WorkflowCalls(KubeAuthorizer(None, authn=rbac, authz=rbac, clock=FakeClock(start=1.0)), read,
                         lambda _ns: engine, frozenset({"demo"}))


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Engine, Rbac]]:
    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id="operator-1")
    rbac = Rbac()
    calls = calls_of(engine, rbac)
    svc = service(store, await local_gate(tmp_path / "home"))
    st = await engine.run(counter, {"log": str(tmp_path / "log"), "start": 5}, run_id=cluster_run_id("wf", UID))
    assert st.status == "waiting"
    # A run the status and label point at, which the caller could have written: never the one answered.
    await engine.run(counter, {"log": str(tmp_path / "log2"), "start": 100}, run_id="elsewhere")
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(svc, workflows=calls)),
                               base_url="http://sessions")
    yield client, engine, rbac
    await client.aclose()
    await engine.aclose()
    await store.close()


async def test_a_viewer_queries_and_an_editor_updates_the_run_the_object_names(
    setup: tuple[httpx.AsyncClient, Engine, Rbac],
) -> None:
    client, engine, rbac = setup
    run_id = cluster_run_id("wf", UID)
    q = await client.post(URL + "/queries/total", json={}, headers={"Authorization": "Bearer t-viewer"})
    assert q.status_code == 200, q.text
    assert q.json() == {"runId": run_id, "query": "total", "answer": 5}  # not the run status/labels name
    up = await client.post(URL + "/updates/add", json={"input": {"amount": 2}, "updateId": "u1"},
                           headers={"Authorization": "Bearer t-editor"})
    assert up.status_code == 200, up.text
    assert up.json() == {"runId": run_id, "update": "add", "updateId": "u1", "result": 7, "new": True}
    again = await client.post(URL + "/updates/add", json={"input": {"amount": 2}, "updateId": "u1"},
                              headers={"Authorization": "Bearer t-editor"})
    assert again.json()["new"] is False and again.json()["result"] == 7
    verbs = [(r.spec.user, r.spec.resource_attributes.verb) for r in rbac.asked]
    assert verbs == [(VIEWER, "get"), (EDITOR, "update")]  # the editor's allow is remembered for its retry
    assert await engine.query("elsewhere", "total") == 100


async def test_a_viewer_may_not_update_and_nothing_is_recorded(setup: tuple[httpx.AsyncClient, Engine, Rbac]) -> None:
    client, engine, _ = setup
    up = await client.post(URL + "/updates/add", json={"input": {"amount": 2}}, headers={"Authorization": "Bearer t-viewer"})
    assert up.status_code == 403
    error = up.json()["error"]
    assert "may not update this Workflow" in error["what"] and "grant update on workflows" in error["do"]
    assert [r for r in await engine.history(cluster_run_id("wf", UID)) if r.kind == "update"] == []
    anonymous = await client.post(URL + "/queries/total", json={})
    assert anonymous.status_code == 401


@pytest.mark.parametrize(("path", "body", "status", "what"), [
    ("/updates/add", {"input": {"amount": 0}}, 400, "Input should be greater than 0"),
    ("/updates/nope", {"input": 1}, 400, "registers no update handler 'nope'"),
    ("/queries/nope", {}, 400, "registers no query handler 'nope'"),
    ("/updates/add", {"input": {"amount": 1}, "extra": 1}, 400, "the request body is not valid"),
])
async def test_refusals_say_why_and_record_nothing(
    setup: tuple[httpx.AsyncClient, Engine, Rbac], path: str, body: dict[str, Any], status: int, what: str,
) -> None:
    client, engine, _ = setup
    answer = await client.post(URL + path, json=body, headers={"Authorization": "Bearer t-editor"})
    assert answer.status_code == status, answer.text
    assert what in answer.json()["error"]["what"]
    assert [r for r in await engine.history(cluster_run_id("wf", UID)) if r.kind == "update"] == []


async def test_a_workflow_the_caller_may_not_read_is_refused_before_it_is_looked_up(
    setup: tuple[httpx.AsyncClient, Engine, Rbac],
) -> None:
    client, _, _ = setup
    answer = await client.post("http://sessions/v1/namespaces/demo/workflows/other/queries/total", json={},
                               headers={"Authorization": "Bearer t-editor"})
    assert answer.status_code == 403  # asked about first: the caller learns nothing of objects it may not read


async def test_the_python_client_queries_and_updates_once_per_update_id(tmp_path: Path) -> None:
    """durable_sandbox.client.WorkflowClient against the call API served on a port (start_session_api)."""
    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id="operator-1")
    st = await engine.run(counter, {"log": str(tmp_path / "log"), "start": 5}, run_id=cluster_run_id("wf", UID))
    assert st.status == "waiting"
    api = await start_session_api(service(store, await local_gate(tmp_path / "home")), host="127.0.0.1", port=0,
                                  workflows=calls_of(engine, Rbac()))
    url = f"http://127.0.0.1:{api.port}"

    def cli() -> list[Any]:  # `dsb --kube`: the same API, the Workflow named
        base = ["--kube", "-n", "demo", "-o", "json"]
        up = dsb(*base, "update", "wf", "add", "--input", '{"amount": 1}', "--id", "cli-1", "--url", url,
                 "--token", "t-editor")
        q = dsb(*base, "query", "wf", "total", "--url", url, "--token", "t-viewer")
        denied = dsb("--kube", "-n", "demo", "update", "wf", "add", "--input", '{"amount": 1}', "--url", url,
                     "--token", "t-viewer")
        return [up.exit_code, json.loads(up.stdout or "null"), q.exit_code, json.loads(q.stdout or "null"),
                denied.exit_code, denied.stderr]

    def use() -> tuple[Any, ...]:
        with WorkflowClient.attach("wf", namespace="demo", url=url, token="t-editor") as wf:
            refused: Any = None
            first = wf.update("add", {"amount": 2}, update_id="u1")
            again = wf.update("add", {"amount": 2}, update_id="u1")
            try:
                wf.update("add", {"amount": 0})
            except SandboxCallError as exc:
                refused = (exc.status, exc.error["what"])
            return first, again, wf.query("added", 5), refused

    try:
        first, again, added, refused = await asyncio.to_thread(use)
        ran = await asyncio.to_thread(cli)
    finally:
        await api.stop()
        await engine.aclose()
        await store.close()
    assert (first, again, added) == (7, 7, [2])
    assert refused[0] == 400 and "Input should be greater than 0" in refused[1]
    run_id = cluster_run_id("wf", UID)
    assert ran[:4] == [0, {"runId": run_id, "update": "add", "updateId": "cli-1", "result": 8, "new": True},
                       0, {"runId": run_id, "query": "total", "answer": 8}]
    assert ran[4] == 1 and "may not update this Workflow" in ran[5]


async def test_queries_and_updates_are_held_to_the_callers_rate_like_calls(tmp_path: Path) -> None:
    """One bucket per caller for the whole call API: a caller over its rate is refused (429, Retry-After) before
    its query or update reaches the run, whatever it calls; another caller is not affected."""
    store = SqliteStore(tmp_path / "runs.db")
    engine = Engine(store, worker_id="operator-1")
    svc = service(store, await local_gate(tmp_path / "home"), limits=Limits(max_calls_per_second=1))
    svc.rates = CallerRates(1, clock=FakeClock(start=100.0))  # time stands still: one request per caller
    await engine.run(counter, {"log": str(tmp_path / "log"), "start": 5}, run_id=cluster_run_id("wf", UID))
    app = create_app(svc, workflows=calls_of(engine, Rbac()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sessions") as client:
        editor, viewer = {"Authorization": "Bearer t-editor"}, {"Authorization": "Bearer t-viewer"}
        assert (await client.post(URL + "/queries/total", json={}, headers=editor)).status_code == 200
        over = await client.post(URL + "/updates/add", json={"input": {"amount": 2}, "updateId": "u1"}, headers=editor)
        assert over.status_code == 429 and over.headers["retry-after"] == "1", over.text
        assert f"{EDITOR} made more than 1 calls per second" in over.json()["error"]["what"]
        assert (await client.post(URL + "/queries/total", json={}, headers=viewer)).json()["answer"] == 5
    assert [r for r in await engine.history(cluster_run_id("wf", UID)) if r.kind == "update"] == []
    await engine.aclose()
    await store.close()
