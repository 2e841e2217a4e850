"""SqliteStore: leases with fencing, claim_next, sharing one file between instances and processes,
durability modes, and the engine worker on top."""

import asyncio
import json
import sqlite3
import sys
import textwrap

import pytest

from durable_sandbox.engine import Engine, LeaseHeld, LeaseLost, RunStatus, workflow
from durable_sandbox.engine.records import Commit, ErrorInfo, OperationRecord, RunRecord
from durable_sandbox.stores import SqliteStore, default_home
from durable_sandbox.stores.sqlite_checkpoint import HARD_FACTOR


async def _new_run(store, run_id, **kw):
    run, created = await store.create_run(RunRecord(run_id=run_id, workflow="wf", input={"i": 1}, **kw))
    assert created
    return run


def _rec(op_id, status="completed", result=None):
    return OperationRecord(op_id, "step", "fn", status, 1, "d", result)


# ---------------------------------------------------------------------------------------------- runs & journal


async def test_create_run_is_idempotent(store):
    await _new_run(store, "r")
    stored, created = await store.create_run(RunRecord(run_id="r", workflow="other", input=None))
    assert not created and stored.workflow == "wf" and stored.input == {"i": 1}
    assert (await store.get_run("r")).status == RunStatus.PENDING
    assert await store.get_run("missing") is None


async def test_commit_is_atomic_and_journal_ordered(store):
    await _new_run(store, "r")
    lease = await store.claim("r", "w1", 30)
    await store.commit("r", lease.fence, Commit([_rec("a", "started")]))
    await store.commit(
        "r",
        lease.fence,
        Commit(
            [_rec("a", "completed", {"v": [1, "x"]}), _rec("b", "started")],
            run={"status": RunStatus.RUNNING},
            thread_state=None,
            cache=("key", {"v": 1}, None),
        ),
    )
    rows = await store.load_journal("r")
    assert [(r.op_id, r.status) for r in rows] == [("a", "started"), ("a", "completed"), ("b", "started")]
    assert rows[1].result == {"v": [1, "x"]}
    assert rows[0].seq < rows[1].seq < rows[2].seq
    assert [r.op_id for r in await store.journal_since("r", rows[0].seq)] == ["a", "b"]
    assert (await store.get_run("r")).status == RunStatus.RUNNING
    assert (await store.cache_get("key", 0))[0] == {"v": 1}


async def test_error_and_meta_round_trip(store):
    await _new_run(store, "r")
    lease = await store.claim("r", "w1", 30)
    rec = OperationRecord(
        "a",
        "step",
        "fn",
        "failed",
        2,
        "d",
        error=ErrorInfo("ValueError", "bad", True),
        meta={"nextAttemptAt": 12.5},
    )
    await store.commit("r", lease.fence, Commit([rec]))
    (row,) = await store.load_journal("r")
    assert row.error == ErrorInfo("ValueError", "bad", True) and row.meta == {"nextAttemptAt": 12.5}
    assert row.attempt == 2 and row.result is None


# ---------------------------------------------------------------------------------------------- leases


async def test_second_claim_while_held_raises_lease_held(store):
    await _new_run(store, "r")
    lease = await store.claim("r", "w1", 30)
    with pytest.raises(LeaseHeld) as info:
        await store.claim("r", "w2", 30)
    assert info.value.owner == "w1" and "w1" in str(info.value)
    again = await store.claim("r", "w1", 30)  # the owner may re-claim; the fence still moves
    assert again.fence == lease.fence + 1


async def test_expired_lease_can_be_claimed_and_bumps_fence(store, clock):
    await _new_run(store, "r")
    old = await store.claim("r", "w1", 30)
    clock.advance(31)
    new = await store.claim("r", "w2", 30)
    assert new.owner == "w2" and new.fence == old.fence + 1
    run = await store.get_run("r")
    assert run.lease_owner == "w2" and run.fence == new.fence


async def test_commit_with_stale_fence_raises_lease_lost_and_writes_nothing(store, clock):
    await _new_run(store, "r")
    old = await store.claim("r", "w1", 30)
    await store.commit("r", old.fence, Commit([_rec("a", "started")]))
    clock.advance(31)
    new = await store.claim("r", "w2", 30)

    before = await store.load_journal("r")
    with pytest.raises(LeaseLost):  # the single-record fast path
        await store.commit("r", old.fence, Commit([_rec("a", "completed", 1)]))
    with pytest.raises(LeaseLost):  # the transaction path: rows, run changes, thread state, cache
        await store.commit(
            "r",
            old.fence,
            Commit(
                [_rec("a", "completed", 1), _rec("b")],
                run={"status": RunStatus.SUCCEEDED, "result": 1},
                thread_state=("t", {"x": 1}),
                cache=("k", 1, None),
            ),
        )
    with pytest.raises(LeaseLost):
        await store.update_run("r", {"status": RunStatus.FAILED}, fence=old.fence)
    with pytest.raises(LeaseLost):
        await store.renew(old, 30)
    assert [(r.op_id, r.status) for r in await store.load_journal("r")] == [
        (r.op_id, r.status) for r in before
    ]
    run = await store.get_run("r")
    assert run.status == RunStatus.PENDING and run.result is None
    assert await store.get_thread_state("t") is None and await store.cache_get("k", 0) is None
    # The current holder still writes.
    await store.commit("r", new.fence, Commit([_rec("a", "completed", 2)]))
    assert (await store.load_journal("r"))[-1].result == 2


async def test_release_only_by_current_fence_and_renew(store, clock):
    await _new_run(store, "r")
    old = await store.claim("r", "w1", 30)
    clock.advance(31)
    new = await store.claim("r", "w2", 30)
    await store.release(old)  # stale: must not free w2's lease
    with pytest.raises(LeaseHeld):
        await store.claim("r", "w3", 30)
    renewed = await store.renew(new, 100)
    assert renewed.expires_at > new.expires_at and renewed.fence == new.fence
    await store.release(renewed)
    assert (await store.claim("r", "w3", 30)).owner == "w3"


async def test_engine_loses_lease_and_stops_writing(store, clock):
    """A worker whose lease was taken over cannot record anything more for the run."""
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def slow():
        entered.set()
        await gate.wait()
        return "late"

    @workflow(name="store-lease-lost")
    async def wf(ctx):
        await ctx.step("slow", slow)
        await ctx.step("next", lambda: "never")

    eng = Engine(store, worker_id="w1", lease_ttl=300)
    task = asyncio.create_task(eng.run(wf, run_id="ll"))
    await asyncio.wait_for(entered.wait(), 5)
    clock.advance(301)
    thief = await store.claim("ll", "w2", 300)  # w1's lease expired; w2 takes over
    gate.set()
    await task
    rows = await store.load_journal("ll")
    assert [(r.op_id, r.status) for r in rows] == [("slow", "started")]
    run = await store.get_run("ll")
    assert run.status == RunStatus.RUNNING and run.fence == thief.fence and run.lease_owner == "w2"


# ---------------------------------------------------------------------------------------------- claim_next


async def test_claim_next_picks_pending_due_and_orphaned_runs(store, clock):
    now = clock.time()
    await _new_run(store, "pending")
    await _new_run(store, "due", status=RunStatus.WAITING, wake_at=now - 1)
    await _new_run(store, "not-due", status=RunStatus.WAITING, wake_at=now + 1000)
    await _new_run(store, "waiting-forever", status=RunStatus.WAITING)
    await _new_run(store, "done", status=RunStatus.SUCCEEDED)
    await _new_run(store, "failed", status=RunStatus.FAILED)
    await _new_run(store, "orphan", status=RunStatus.RUNNING)
    await _new_run(store, "busy", status=RunStatus.RUNNING)
    await store.claim("orphan", "dead-worker", 10)
    await store.claim("busy", "live-worker", 1000)
    clock.advance(11)  # the dead worker's lease expires; the live one's does not

    claimed = set()
    while (lease := await store.claim_next("me", 30)) is not None:
        assert lease.owner == "me" and lease.run_id not in claimed
        claimed.add(lease.run_id)
    assert claimed == {"pending", "due", "orphan"}


async def test_claim_next_filters_by_workflow(store):
    await store.create_run(RunRecord(run_id="a", workflow="alpha"))
    await store.create_run(RunRecord(run_id="b", workflow="beta"))
    lease = await store.claim_next("me", 30, workflows=["beta"])
    assert lease is not None and lease.run_id == "b"
    assert await store.claim_next("me", 30, workflows=["beta"]) is None


async def test_worker_executes_pending_runs(engine, store):
    calls = []

    @workflow(name="store-worker")
    async def wf(ctx, n):
        return await ctx.step("double", lambda: calls.append(n) or n * 2)

    for i in range(5):
        await engine.create(wf, i, run_id=f"w{i}")
    assert calls == []
    await engine.worker(concurrency=2, idle_exit=True, poll_interval=0.01)
    for i in range(5):
        st = await engine.inspect(f"w{i}")
        assert st.status == "succeeded" and st.result == i * 2
    assert sorted(calls) == list(range(5))
    assert all(r.lease_owner is None for r in await store.list_runs())


async def test_worker_stops_on_event(engine):
    stop = asyncio.Event()

    @workflow(name="store-worker-stop")
    async def wf(ctx):
        stop.set()
        return "ran"

    await engine.create(wf, run_id="s")
    await asyncio.wait_for(engine.worker(poll_interval=0.01, stop=stop), 5)
    assert (await engine.inspect("s")).result == "ran"


# ---------------------------------------------------------------------------------------------- sharing


async def test_two_instances_share_one_file(db_path):
    a, b = SqliteStore(db_path), SqliteStore(db_path)
    try:
        await _new_run(a, "r")
        assert (await b.get_run("r")).input == {"i": 1}
        lease = await a.claim("r", "wa", 30)
        with pytest.raises(LeaseHeld):
            await b.claim("r", "wb", 30)
        await a.commit("r", lease.fence, Commit([_rec("x", "completed", 7)]))
        assert [(r.op_id, r.result) for r in await b.load_journal("r")] == [("x", 7)]
        assert await b.put_signal("r", "cb", 1) is True
        assert await a.put_signal("r", "cb", 1) is False
        assert await a.get_signals("r") == {"cb": 1}
    finally:
        await a.close()
        await b.close()


WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from durable_sandbox.engine import Engine, workflow
    from durable_sandbox.stores import SqliteStore

    log = sys.argv[2]

    def effect(i):
        with open(log, "a") as f:
            f.write(f"{i} {os.getpid()}\\n")
        return i

    @workflow(name="shared-wf")
    async def wf(ctx, i):
        return await ctx.step("effect", effect, i)

    async def main():
        engine = Engine(SqliteStore(sys.argv[1]), lease_ttl=30)
        await engine.worker(concurrency=2, idle_exit=True, poll_interval=0.01)

    asyncio.run(main())
    """
)


async def test_two_processes_share_one_file_and_execute_each_run_once(engine, db_path, tmp_path):
    log = tmp_path / "effects.log"

    @workflow(name="shared-wf")
    async def wf(ctx, i):
        raise AssertionError("the test process only creates runs")

    n = 40
    for i in range(n):
        await engine.create(wf, i, run_id=f"run-{i}")
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", WORKER_SCRIPT, str(db_path), str(log))
        for _ in range(2)
    ]
    codes = [await asyncio.wait_for(p.wait(), 60) for p in procs]
    assert codes == [0, 0]
    lines = log.read_text().split("\n")[:-1]
    assert sorted(int(line.split()[0]) for line in lines) == list(range(n))  # each run's step exactly once
    for i in range(n):
        st = await engine.inspect(f"run-{i}")
        assert st.status == "succeeded" and st.result == i


# ---------------------------------------------------------------------------------------------- durability


async def test_fsync_durability(db_path):
    with pytest.raises(ValueError, match="durability"):
        SqliteStore(db_path, durability="sometimes")
    store = SqliteStore(db_path, durability="fsync")
    try:
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

        @workflow(name="store-fsync")
        async def wf(ctx):
            a = await ctx.step("a", lambda: 1)
            return a + await ctx.step("b", lambda: 2)

        st = await Engine(store).run(wf, run_id="f")
        assert st.status == "succeeded" and st.result == 3
    finally:
        await store.close()
    con = sqlite3.connect(db_path)  # readable by anyone after close
    try:
        rows = con.execute("SELECT op_id, status, result FROM ops WHERE run_id='f' ORDER BY seq").fetchall()
    finally:
        con.close()
    assert [(o, s, json.loads(r) if r else None) for o, s, r in rows] == [
        ("a", "started", None),
        ("a", "completed", 1),
        ("b", "started", None),
        ("b", "completed", 2),
    ]


async def test_default_path_is_under_durable_sandbox_home(home):
    assert default_home() == home
    store = SqliteStore()
    try:
        assert store.path == home / "runs.db" and store.path.exists()
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------------- signals, cache, events


async def test_signals_cache_thread_state_and_events(store, clock):
    await _new_run(store, "r", thread_id="t")
    assert await store.put_signal("r", "cb", {"a": 1, "b": 2}) is True
    assert await store.put_signal("r", "cb", {"b": 2, "a": 1}) is False
    lease = await store.claim("r", "w", 30)
    await store.commit(
        "r", lease.fence, Commit([], thread_state=("t", {"n": 1}), cache=("k", [1], clock.time() + 5))
    )
    assert await store.get_thread_state("t") == {"n": 1}
    assert (await store.cache_get("k", clock.time()))[0] == [1]
    assert await store.cache_get("k", clock.time() + 6) is None
    from durable_sandbox.engine.records import Event

    await store.append_events([Event("r", "progress", {"message": "hi"}), Event("r", "run.started")])
    events = await store.read_events("r")
    assert [e.type for e in events] == ["progress", "run.started"] and events[0].data == {"message": "hi"}
    assert [e.type for e in await store.read_events("r", after=events[0].seq)] == ["run.started"]


async def test_list_runs(store):
    await store.create_run(RunRecord(run_id="a", workflow="x", status=RunStatus.SUCCEEDED))
    await store.create_run(RunRecord(run_id="b", workflow="y"))
    assert {r.run_id for r in await store.list_runs()} == {"a", "b"}
    assert [r.run_id for r in await store.list_runs(status=[RunStatus.PENDING])] == ["b"]
    assert [r.run_id for r in await store.list_runs(workflow="x")] == ["a"]



# ---------------------------------------------------------------------------------------------- WAL checkpoints


async def test_commit_connection_never_checkpoints_itself_and_the_wal_stays_bounded(db_path):
    """The commit connection's automatic checkpoint is off (it would run inside whichever COMMIT passes the
    threshold); the store's own checkpoints keep the WAL within four times the threshold under many commits."""
    pages = 256
    store = SqliteStore(db_path, checkpoint_pages=pages)
    try:
        assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        page = store._db.execute("PRAGMA page_size").fetchone()[0]
        wal = db_path.with_name(db_path.name + "-wal")
        await _new_run(store, "r")
        lease = await store.claim("r", "w1", 30)
        # HARD_FACTOR times the threshold, and one look's 32 commits of at most 4 frames each; without
        # checkpoints the 3,000 commits grow it past 20 MiB
        bound = HARD_FACTOR * pages * page + 32 * 4 * (page + 24)
        largest = 0
        for i in range(3000):
            await store.commit("r", lease.fence, Commit([_rec(f"op{i}", "completed", {"pad": "x" * 2000})]))
            largest = max(largest, wal.stat().st_size)
        assert largest <= bound, f"the WAL grew to {largest} bytes (bound {bound})"
        assert store.checkpoints.background + store.checkpoints.inline > 0
        assert len(await store.load_journal("r")) == 3000
    finally:
        await store.close()


def test_committed_records_survive_a_kill_with_checkpoints_off_the_commit_path(db_path, tmp_path):
    """A commit is durable once it is in the WAL: a process killed right after its last commit (no close, no
    checkpoint) leaves every committed record readable by the next connection."""
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, os, signal
        from durable_sandbox.engine.records import Commit, OperationRecord, RunRecord
        from durable_sandbox.stores import SqliteStore

        async def main():
            store = SqliteStore({str(db_path)!r}, checkpoint_pages=16)
            await store.create_run(RunRecord(run_id="r", workflow="wf", input=None))
            lease = await store.claim("r", "w", 30)
            for i in range(500):
                rec = OperationRecord(f"op{{i}}", "step", "fn", "completed", 1, "d", {{"pad": "x" * 3000}})
                await store.commit("r", lease.fence, Commit([rec]))
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
    """))
    import subprocess

    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    con = sqlite3.connect(db_path)
    try:
        assert con.execute("SELECT count(*) FROM ops WHERE run_id='r'").fetchone()[0] == 500
    finally:
        con.close()
