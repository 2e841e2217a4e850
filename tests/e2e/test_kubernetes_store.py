"""KubernetesStore beyond the contract kit, on the real control plane: fencing between two processes,
journal chunk rollover with a 10,000-record journal, and the API writes a commit costs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from durable_sandbox.engine.errors import LeaseHeld
from durable_sandbox.engine.records import Commit, Event, OperationRecord, RunRecord
from durable_sandbox.kube.store import CHUNK_BYTES, TAIL_BYTES, KubernetesStore, OwnerRef
from tests.e2e.controlplane import PROJECT_ROOT, ControlPlane
from tests.e2e.store_support import TEST_JOURNAL_KEY, ManualMonotonic, drop_namespace, namespace_with_crds

pytestmark = pytest.mark.apiserver_journal("KubernetesStore itself; PostgresStore's own: tests/postgres")

MiB = 1024 * 1024


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = namespace_with_crds(control_plane, "kstore")
    yield name
    drop_namespace(control_plane, name)


@pytest.fixture
async def store(namespace: str) -> AsyncIterator[KubernetesStore]:
    s = await KubernetesStore.connect(namespace, clock=ManualMonotonic(), journal_key=TEST_JOURNAL_KEY)
    yield s
    await s.close()


def _rec(op_id: str, result: object) -> OperationRecord:
    return OperationRecord(op_id, "sandbox.call", "shell", "completed", 1, "d", result)


class Worker:
    """tests/e2e/store_worker.py in its own process: one commit per line we send it."""

    def __init__(self, namespace: str, run_id: str, owner: str, *args: str, fault: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        if fault:
            env["DURABLE_SANDBOX_FAULT"] = fault
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.store_worker", namespace, run_id, owner, *args],
            cwd=PROJECT_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )

    def line(self) -> str:
        assert self.proc.stdout is not None
        out = self.proc.stdout.readline().strip()
        assert out, f"the worker exited early with {self.proc.wait()}"
        return out

    def step(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.line()

    def finish(self) -> int:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        return self.proc.wait(timeout=60)


async def test_a_worker_process_that_lost_its_lease_cannot_append(
    control_plane: ControlPlane, namespace: str, store: KubernetesStore
) -> None:
    run, _ = await store.create_run(RunRecord(run_id="fenced-run", workflow="wf"))
    worker = Worker(namespace, run.run_id, "worker-a")
    try:
        claimed = worker.line()
        assert claimed.startswith("claimed "), claimed
        old_fence = int(claimed.split()[1])
        assert [worker.step() for _ in range(3)] == [f"committed worker-a-{i} {i}" for i in (1, 2, 3)]

        with pytest.raises(LeaseHeld):  # worker-a's lease is live; this also starts our observation of it
            await store.claim(run.run_id, "worker-b", 30)
        store.leases.clock.advance(31)  # type: ignore[attr-defined]
        # worker-a never renews: by our monotonic clock its Lease has not changed for leaseDurationSeconds.
        lease = await store.claim(run.run_id, "worker-b", 30)
        assert lease.fence == old_fence + 1
        await store.commit(run.run_id, lease.fence, Commit([_rec("worker-b-1", "b")]))

        assert worker.step() == "lost worker-a-4"
        assert worker.line() == "renew lost"
        assert worker.line() == "released"
        assert worker.finish() == 0
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()

    rows = await store.load_journal(run.run_id)
    assert [(r.seq, r.op_id) for r in rows] == [
        (1, "worker-a-1"), (2, "worker-a-2"), (3, "worker-a-3"), (4, "worker-b-1")]
    # worker-a's release after losing the lease did not free worker-b's.
    held = control_plane.kubectl_json("get", "journal", f"dsb.{run.run_id}.lease", "-n", namespace)
    assert held["part"] == "lease" and held["data"]["holder"] == "worker-b"
    assert held["data"]["transitions"] == str(lease.fence)
    other = await KubernetesStore.connect(namespace)
    try:
        with pytest.raises(LeaseHeld):
            await other.claim(run.run_id, "worker-c", 30)
    finally:
        await other.close()


async def test_thread_state_of_a_worker_killed_after_its_commit_is_applied_at_the_next_claim(
    namespace: str, store: KubernetesStore
) -> None:
    """Kubernetes has no multi-object transaction: the commit lands in the head with a redo entry, and the
    thread state object is written after it. SIGKILL in between (a fault point, not timing luck)."""
    run, _ = await store.create_run(RunRecord(run_id="redo-run", workflow="wf", thread_id="shared-thread"))
    worker = Worker(namespace, run.run_id, "doomed", "--thread-state", fault="kube.store.before_side_writes")
    assert worker.line().startswith("claimed ")
    assert worker.proc.wait(timeout=60) == -9, "the fault point should have killed the worker"
    assert [r.op_id for r in await store.load_journal(run.run_id)] == ["with-state"]
    assert await store.get_thread_state("shared-thread") is None  # the window the redo entry covers

    with pytest.raises(LeaseHeld):  # the dead worker's lease: observed now, expired by our clock below
        await store.claim(run.run_id, "rescuer", 30)
    store.leases.clock.advance(31)  # type: ignore[attr-defined]
    await store.claim(run.run_id, "rescuer", 30)
    assert await store.get_thread_state("shared-thread") == {"n": 1}


async def test_a_large_journal_rolls_over_into_chunks_under_one_mib(
    control_plane: ControlPlane, namespace: str, store: KubernetesStore
) -> None:
    run, _ = await store.create_run(RunRecord(run_id="big-journal", workflow="wf"))
    lease = await store.claim(run.run_id, "w", 300)
    total, per_commit = 10_000, 10
    expected: list[tuple[str, object]] = []
    for start in range(0, total, per_commit):
        batch = []
        for i in range(start, start + per_commit):
            # Every 997th result is larger than a record may be inline: it goes to a blob by reference.
            result = {"i": i, "stdout": ("x" * 40_000) if i % 997 == 0 else f"line {i}\n"}
            batch.append(_rec(f"call-{i}", result))
            expected.append((f"call-{i}", result))
        await store.commit(run.run_id, lease.fence, Commit(batch))

    objects = control_plane.kubectl_json("get", "journals", "-n", namespace, "-l",
                                         "durable-sandbox.dev/run-id=big-journal")["items"]
    sizes = {o["metadata"]["name"]: len(json.dumps(o).encode()) for o in objects}
    assert max(sizes.values()) < MiB, f"an object is over 1 MiB: {sizes}"
    chunks = [n for n in sizes if re.fullmatch(r"dsb\.big-journal\.j\d+", n)]
    assert len(chunks) >= 3, f"expected the journal to roll over into several chunks, got {sorted(sizes)}"
    assert max(sizes[c] for c in chunks) > CHUNK_BYTES // 2, "chunks take tails until they are full"
    assert sizes["dsb.big-journal"] < 2 * TAIL_BYTES + 64 * 1024, "the head keeps only a bounded tail"
    assert store.journal_objects(run.run_id) == sorted(chunks)
    print(f"\n10,000 records: head {sizes['dsb.big-journal']} bytes, {len(chunks)} chunks of "
          f"{min(sizes[c] for c in chunks)}..{max(sizes[c] for c in chunks)} bytes, {store.write_count} writes")

    fresh = await KubernetesStore.connect(namespace)  # another process without the key (dsb --kube): seals stripped
    try:
        rows = await fresh.load_journal(run.run_id)
        assert [r.seq for r in rows] == list(range(1, total + 1)), "gaps or duplicates in the journal"
        assert [(r.op_id, r.result) for r in rows] == expected
        for after in (1, 4_321, 9_999):
            since = await fresh.journal_since(run.run_id, after)
            assert [r.seq for r in since] == list(range(after + 1, total + 1))
    finally:
        await fresh.close()


def _apiserver_writes(control_plane: ControlPlane) -> dict[str, float]:
    """Write requests the apiserver has served, by "VERB resource", from its own apiserver_request_total."""
    text = control_plane.kubectl("get", "--raw", "/metrics").stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") in ("POST", "PUT", "PATCH", "DELETE", "APPLY") and labels.get("resource") in (
            "journals",):
            key = f"{labels['verb']} {labels['resource']}"
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def test_a_commit_costs_one_api_write(control_plane: ControlPlane, store: KubernetesStore) -> None:
    """The step path (one record per commit, started then completed) against the apiserver's own count."""
    run, _ = await store.create_run(RunRecord(run_id="write-budget", workflow="wf"))
    lease = await store.claim(run.run_id, "w", 300)
    commits = 1_000
    before, client_before = _apiserver_writes(control_plane), store.write_count
    for i in range(commits // 2):
        await store.commit(run.run_id, lease.fence, Commit([OperationRecord(f"s{i}", "step", "fn", "started", 1)]))
        await store.commit(run.run_id, lease.fence, Commit([_rec(f"s{i}", {"ok": i})]))
    after, client_writes = _apiserver_writes(control_plane), store.write_count - client_before
    server_writes = sum(after.values()) - sum(before.values())
    per_commit = server_writes / commits
    print(f"\nKubernetesStore: {server_writes:.0f} apiserver writes for {commits} commits "
          f"({per_commit:.3f} per commit; the store counted {client_writes}); by verb: "
          f"{ {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} }")
    assert client_writes <= server_writes, "the store must count every write it makes"
    # One patch per commit, plus one chunk write per ~32 KiB of journal (and whatever else the control
    # plane wrote meanwhile, e.g. its own leader-election-free controllers: nothing on journals).
    assert per_commit <= 1.05, f"{per_commit:.3f} API writes per commit"
    assert len(await store.load_journal(run.run_id)) == commits


async def test_every_object_of_a_run_is_owned_by_its_workflow_and_goes_with_it(
    control_plane: ControlPlane, namespace: str, store: KubernetesStore
) -> None:
    """Objects made by any instance (here a fresh one for events and run updates, as a CLI would) carry the
    owner reference; deleting the owner lets the garbage collector remove them all."""
    owner = control_plane.kubectl_json("create", "configmap", "stand-in-owner", "-n", namespace)
    ref = OwnerRef(name="stand-in-owner", uid=owner["metadata"]["uid"], api_version="v1", kind="ConfigMap")
    run, _ = await store.create_run(RunRecord(run_id="owned", workflow="wf", input={"big": "i" * 40_000}), owner=ref)
    lease = await store.claim(run.run_id, "w", 30)
    await store.commit(run.run_id, lease.fence, Commit([_rec(f"c{i}", "r" * 2_000) for i in range(40)]))
    await store.commit(run.run_id, lease.fence, Commit([_rec("big", "b" * 50_000)]))
    other = await KubernetesStore.connect(namespace, journal_key=TEST_JOURNAL_KEY)
    try:
        await other.append_events([Event(run.run_id, "progress", {"message": "hi"})])
        await other.update_run(run.run_id, {"result": "x" * 40_000})
    finally:
        await other.close()
    selector = "durable-sandbox.dev/run-id=owned"
    objects = control_plane.kubectl_json("get", "journals", "-n", namespace, "-l", selector)["items"]
    parts = sorted({o["metadata"]["labels"]["durable-sandbox.dev/part"] for o in objects})
    assert parts == ["blob", "events", "journal", "lease", "run"], parts
    unowned = [o["metadata"]["name"] for o in objects
               if [r["uid"] for r in o["metadata"].get("ownerReferences") or []] != [ref.uid]]
    assert unowned == [], f"objects without the run's owner: {unowned}"

    control_plane.kubectl("delete", "configmap", "stand-in-owner", "-n", namespace)
    control_plane.wait_until(
        lambda: not control_plane.kubectl_json("get", "journals", "-n", namespace, "-l", selector)["items"],
        60, "the garbage collector to delete the run's objects with their owner")


@pytest.mark.parametrize("landed", ["yes", "no", "late"], ids=["answer-lost", "request-failed", "landed-late"])
async def test_a_commit_whose_outcome_is_unknown_is_neither_lost_nor_doubled(
    namespace: str, store: KubernetesStore, monkeypatch: pytest.MonkeyPatch, landed: str
) -> None:
    """The connection drops on a commit, after the apiserver applied it (``answer-lost``), before
    (``request-failed``), or while it is still being applied, so that it lands only after the store read the
    head to find out (``landed-late``: the retry's ``test seq`` fails, and the store must not append the records
    once more): the store finds out from the head which, and the journal has each record once."""
    run, _ = await store.create_run(RunRecord(run_id=f"flaky-{landed}", workflow="wf"))
    lease = await store.claim(run.run_id, "w", 30)
    await store.commit(run.run_id, lease.fence, Commit([_rec("before", 0)]))
    real_patch = store.objects.patch
    failures = iter([True])
    late: list[list[dict[str, object]]] = []

    async def flaky_patch(name: str, ops: list[dict[str, object]]) -> None:
        if next(failures, False):
            if landed == "yes":
                await real_patch(name, ops)
            elif landed == "late":
                late.append(ops)
            raise aiohttp.ServerDisconnectedError()
        while late:
            await real_patch(name, late.pop())  # the lost attempt lands now, after the head was read
        await real_patch(name, ops)

    monkeypatch.setattr(store.objects, "patch", flaky_patch)
    records = [_rec("flaky-1", 1), _rec("flaky-2", 2)]
    await store.commit(run.run_id, lease.fence, Commit(records))
    assert not next(failures, False), "the commit never went through the failing patch"
    assert [r.seq for r in records] == [2, 3]
    await store.commit(run.run_id, lease.fence, Commit([_rec("after", 3)]))
    rows = await store.load_journal(run.run_id)
    assert [(r.seq, r.op_id) for r in rows] == [(1, "before"), (2, "flaky-1"), (3, "flaky-2"), (4, "after")]
