"""Issue 35 item 5: the web view shows a Sandbox's session timeline as it shows a run's (ui/sandbox_session.py).

A real session journal (the call service over SQLite, a LocalProvider sandbox lost mid-session) read through
``ClusterSource`` with a fake API server: the Sandboxes page links each Sandbox to ``/run?id=sandbox/NAME``; its
timeline has every call with its caller's operation id, the snapshots, the loss and recovery (the Sandbox's
Events), the rebuild and the calls it replayed; the header's counts are the summary ``dsb --kube inspect
sandbox/NAME`` prints; a Sandbox is its uid (a re-created one shows none of the old one's calls); no env value
reaches a page; and a long session keeps only its newest items."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from durable_sandbox.engine import RunNotFound
from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.kube.api.client import ApiException
from durable_sandbox.kube.api.resources import SANDBOXES
from durable_sandbox.kube.spec.workflows import NoSuchWorkflow
from durable_sandbox.runs.cluster import ClusterEngine
from durable_sandbox.sessions.journal import calls_run_id
from durable_sandbox.sessions.models import ShellRequest
from durable_sandbox.stores.sqlite import SqliteStore
from durable_sandbox.ui.app import create_app
from durable_sandbox.ui.cluster import ClusterSource
from durable_sandbox.ui.security import Guard
from durable_sandbox.ui.timeline import Timeline
from tests.unit.sessions_support import NAMESPACE, FakeGate, local_gate, service

PORT = 41235
TOKEN = "test-token-0123456789"
SECRET = "s3cret-value-never-shown"


def sandbox(name: str, uid: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": uid, "resourceVersion": "7",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"provider": "local", "snapshotEveryNCalls": 2}, "status": {"phase": "Ready", **status}}


class Objects:
    def __init__(self, boxes: list[dict[str, Any]]) -> None:
        self.boxes = {b["metadata"]["name"]: b for b in boxes}
        self.refuse: set[str] = set()  # names the kubeconfig may not get (403)

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert plural == SANDBOXES and namespace == NAMESPACE
        if name in self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        return self.boxes.get(name)

    async def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return list(self.boxes.values()) if plural == SANDBOXES else []


class Workflows:
    def __init__(self, objects: Objects) -> None:
        self.objects = objects

    async def list(self) -> list[dict[str, Any]]:
        return []

    async def find(self, ref: str) -> dict[str, Any]:
        raise NoSuchWorkflow(f"No Workflow named {ref!r}")


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.status, self.reason, self._body = 200, "OK", json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


class Core:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.selectors: list[str] = []

    async def list_namespaced_event_without_preload_content(self, namespace: str, field_selector: str) -> Response:
        self.selectors.append(field_selector)
        return Response({"items": self.events})


def event(uid: str, reason: str, message: str, at: str, kind: str = "Normal") -> dict[str, Any]:
    return {"metadata": {"uid": f"ev-{reason}-{uid}"}, "involvedObject": {"kind": "Sandbox", "name": "box", "uid": uid},
            "reason": reason, "message": message, "type": kind, "lastTimestamp": at, "count": 1}


def shell(op: str, command: str, **fields: Any) -> ShellRequest:
    return ShellRequest(operationId=op, command=command, **fields)


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[tuple[SqliteStore, FakeGate]]:
    """Sandbox box (uid-1): five calls (snapshots after 2 and 4), its sandbox lost, a call that rebuilds it (calls 5
    replayed after the snapshot of 4), then a call with an env value."""
    gate = await local_gate(tmp_path / "home")
    store = SqliteStore(tmp_path / "runs.db")
    gate.store, gate.snapshot_every = store, 2
    svc = service(store, gate)
    for i in range(5):
        await svc.call("good-token", NAMESPACE, "box", shell(f"op-{i}", f"echo {i} >> f" + ("; exit 3" if i == 4 else "")))
    await gate.provider.inject_loss(gate.handle)
    await svc.call("good-token", NAMESPACE, "box", shell("op-5", "cat f"))
    await svc.call("good-token", NAMESPACE, "box", shell("op-6", "echo $TOKEN | wc -c", env={"TOKEN": SECRET}))
    yield store, gate
    await store.close()


def source_of(store: SqliteStore, boxes: list[dict[str, Any]], events: list[dict[str, Any]]) -> tuple[ClusterSource, Objects]:
    objects = Objects(boxes)
    api = SimpleNamespace(core=Core(events), api_client=SimpleNamespace(configuration=SimpleNamespace(host="https://k8s")))
    cluster = ClusterEngine(NAMESPACE, api, store, Workflows(objects))  # type: ignore[arg-type]
    return ClusterSource(cluster), objects


def client(source: ClusterSource) -> httpx.AsyncClient:
    app = create_app(source, Guard("127.0.0.1", PORT, TOKEN))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://127.0.0.1:{PORT}",
                             headers={"authorization": f"Bearer {TOKEN}"})


async def test_a_sandboxs_page_shows_its_session_calls_snapshots_loss_rebuild_and_replayed_calls(
        session: tuple[SqliteStore, FakeGate]) -> None:
    store, _ = session
    events = [event("uid-1", "SandboxLost", "sandbox x is gone", "2030-01-01T00:00:00Z", "Warning"),
              event("uid-1", "Recovered", "sandbox x recovered into y from snapshot s", "2030-01-01T00:00:01Z"),
              event("uid-old", "SandboxLost", "an earlier Sandbox box", "2030-01-01T00:00:02Z", "Warning")]
    source, _ = source_of(store, [sandbox("box", "uid-1", holder=None, snapshots=[])], events)
    async with client(source) as c:
        listing = (await c.get("/sandboxes")).text
        assert 'href="/run?id=sandbox/box"' in listing or 'href="/run?id=sandbox%2Fbox"' in listing
        page = await c.get("/run", params={"id": "sandbox/box"})
        assert page.status_code == 200, page.text
        assert calls_run_id("uid-1") in page.text and f"{NAMESPACE}/box" in page.text
        assert 'class="actions"' not in page.text  # a Sandbox is steered through its spec, not from here
        tl = (await c.get("/api/timeline", params={"id": "sandbox/box"})).json()
        items = tl["items"]
        calls = [(i["id"], i["o"], i.get("x")) for i in items if i["c"] == "call" and i["o"] != "replayed"]
        assert calls == [("op-0", "ok", 0), ("op-1", "ok", 0), ("op-2", "ok", 0), ("op-3", "ok", 0),
                         ("op-4", "nonzero", 3), ("op-5", "ok", 0), ("op-6", "ok", 0)]
        assert [i["l"] for i in items if i["c"] == "snapshot" and i["r"] == 0] == [
            "snapshot after 2 calls", "snapshot after 4 calls", "snapshot after 6 calls"]
        [rebuild] = [i for i in items if i["c"] == "restore" and i["r"] == 0 and "replay calls" in i["l"]]
        assert rebuild["l"].startswith("rebuild sandbox ") and rebuild["l"].endswith("replay calls 5 to 5")
        [replayed] = [i for i in items if i["o"] == "replayed"]
        assert replayed["id"] == "op-4" and replayed["of"] == "calls/op-4" and replayed["x"] == 3
        assert replayed["t0"] >= rebuild["t0"]
        k8s = [(i["c"], i["l"].split(":")[0]) for i in items if i["r"] == 2]
        assert k8s == [("lost", "SandboxLost"), ("restore", "Recovered")]  # not the earlier Sandbox's (another uid)
        assert tl["omitted"] == 0
        # The record behind a call: what the journal holds, never the env value.
        record = (await c.get("/api/record", params={"id": "sandbox/box", "key": "calls/op-6"})).text
        assert "op-6" in record and SECRET not in record and SECRET not in page.text
        assert SECRET not in json.dumps(tl)


async def test_the_header_is_the_summary_dsb_inspect_prints_and_history_reads_the_same_run(
        session: tuple[SqliteStore, FakeGate]) -> None:
    store, _ = session
    source, _ = source_of(store, [sandbox("box", "uid-1")], [])
    detail = await source.detail("sandbox/box")
    inspected = await source.cluster.inspect("sandbox/box")  # `dsb --kube inspect sandbox/box`
    assert (detail.calls_done, detail.calls_total) == (7, 7)
    assert detail.state.snapshots == inspected.snapshots and len(inspected.snapshots) == 1  # the superseded deleted
    assert detail.state.recovery_count == inspected.recovery_count
    assert detail.run_id == inspected.run_id == calls_run_id("uid-1")
    history = await source.cluster.history("sandbox/box")  # `dsb --kube history sandbox/box`
    assert [r.op_id for r in history if r.kind == "sandbox.call" and r.status == "completed"] == [
        f"calls/op-{i}" for i in range(7)]


async def test_a_sandbox_is_its_uid_and_one_the_kubeconfig_may_not_read_is_not_shown(
        session: tuple[SqliteStore, FakeGate]) -> None:
    store, _ = session
    # Sandbox box deleted and made again: the same name, another uid, none of the old one's calls.
    source, objects = source_of(store, [sandbox("box", "uid-2"), sandbox("secret-box", "uid-1")], [])
    objects.refuse.add("secret-box")
    async with client(source) as c:
        page = await c.get("/run", params={"id": "sandbox/box"})
        assert page.status_code == 200 and "has had no session call yet" in page.text
        assert (await c.get("/api/timeline", params={"id": "sandbox/box"})).json()["items"] == []
        refused = await c.get("/run", params={"id": "sandbox/secret-box"})
        assert refused.status_code == 404 and "403" in refused.text and "op-0" not in refused.text
        assert (await c.get("/api/timeline", params={"id": "sandbox/secret-box"})).status_code == 404
        missing = await c.get("/run", params={"id": "sandbox/nope"})
        assert missing.status_code == 404 and f"no Sandbox {NAMESPACE}/nope" in missing.text
    with pytest.raises(RunNotFound, match=f"Sandbox {NAMESPACE}/box has had no session call yet"):
        await source.cluster.history("sandbox/box")  # `dsb --kube history`: the re-created one has none
    assert (await source.cluster.inspect("sandbox/box")).status == "pending"


def call_rows(n: int, start: float = 1000.0) -> list[OperationRecord]:
    rows = []
    for i in range(n):
        meta = {"index": i, "operationId": f"op-{i}", "call": {"type": "shell", "args": {"command": f"echo {i}"}}}
        rows.append(OperationRecord(f"calls/op-{i}", "sandbox.call", "shell", "started", meta=meta, seq=2 * i + 1,
                                    ts=start + i))
        rows.append(OperationRecord(f"calls/op-{i}", "sandbox.call", "shell", "completed", seq=2 * i + 2,
                                    ts=start + i + 0.5, result={"exitCode": 0, "stdout": "", "stderr": ""},
                                    meta={"index": i, "operationId": f"op-{i}"}))
    return rows


def test_a_long_session_keeps_its_newest_items_and_counts_the_rest() -> None:
    rows = call_rows(50)
    tl = Timeline(1000.0, session=True, cap=20)
    tl.feed(rows[:60])  # 30 calls
    assert len(tl.items) == 20 and tl.omitted == 10
    assert tl.take_evicted() == {f"calls/op-{i}" for i in range(10)}
    changed = tl.feed(rows[60:])  # 20 more: only the kept ones are sent as changes
    assert [i.oid for i in tl.sorted_items()] == [f"op-{i}" for i in range(30, 50)] and tl.omitted == 30
    assert {i.key for i in changed} <= set(tl.items)
    # An item in flight is never dropped: its end comes later.
    tl.feed([OperationRecord("calls/op-50", "sandbox.call", "shell", "started", seq=101, ts=1051.0,
                             meta={"index": 50, "operationId": "op-50"})])
    tl.feed(call_rows(5, start=2000.0)[:0])
    assert "calls/op-50" in tl.items and tl.items["calls/op-50"].outcome == "running"


async def test_a_rewind_shows_on_the_sandboxs_page_with_the_calls_it_rewound(
        session: tuple[SqliteStore, FakeGate]) -> None:
    from durable_sandbox.sessions.models import RewindRequest

    store, gate = session
    await service(store, gate).rewind("good-token", NAMESPACE, "box", RewindRequest(toCall=3))
    source, _ = source_of(store, [sandbox("box", "uid-1", holder=None, snapshots=[])], [])
    async with client(source) as c:
        items = (await c.get("/api/timeline", params={"id": "sandbox/box"})).json()["items"]
    [rewind] = [i for i in items if i["l"].startswith("rewind to after call 3")]
    assert rewind["l"] == "rewind to after call 3: 4 calls rewound"
    assert "op-3, op-4, op-5, op-6" in json.dumps(rewind)
