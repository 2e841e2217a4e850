"""PostgresStore beyond the contract kit: its schema's versions and migrations, what it does while the server
is away (a restart, a crash), a commit whose answer was lost, and what its errors show of the DSN."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from durable_sandbox.engine.errors import JournalDamaged, StoreError, StoreRefused, StoreUnavailable
from durable_sandbox.engine.records import Commit, OperationRecord, RunRecord
from durable_sandbox.stores import postgres_schema
from durable_sandbox.stores.postgres import PostgresStore, split_dsn
from tests.postgres.proxy import CuttingProxy
from tests.postgres.server import PostgresServer


def _rec(op_id: str, result: Any = None, status: str = "completed") -> OperationRecord:
    return OperationRecord(op_id, "step", "fn", status, 1, "d", result)


async def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.connect(postgres_dsn)
    yield s
    await s.close()


async def _sql(dsn: str, fn: Callable[[Any, str], Awaitable[Any]]) -> Any:
    real, schema = split_dsn(dsn)
    conn = await asyncpg.connect(real)
    try:
        return await fn(conn, schema)
    finally:
        await conn.close()


# ------------------------------------------------------------------------------------------- schema versions


async def test_a_store_of_the_first_schema_version_is_migrated_with_its_runs_intact(postgres_dsn: str) -> None:
    async def make_v1(conn: Any, s: str) -> None:
        async with conn.transaction():
            for statement in postgres_schema.prelude(s) + postgres_schema.steps(s, 0, 1):
                await conn.execute(statement)
            await conn.execute(f"INSERT INTO {s}.meta VALUES ('schema_version', '1')")
            # A run as version 1 wrote it: two journal rows, a signal, an event.
            await conn.execute(
                f"INSERT INTO {s}.runs (run_id, workflow, status, input, result, created_at, updated_at, fence, "
                f"lease_owner, lease_expires_at, last_seq) VALUES ('old-run', 'wf', 'running', '{{\"n\":1}}', "
                f"'null', 1.0, 1.0, 3, NULL, NULL, 2)")
            for seq, status in ((1, "started"), (2, "completed")):
                await conn.execute(
                    f"INSERT INTO {s}.ops VALUES ('old-run', $1, 'a', 'step', 'fn', $2, 1, 'd', $3, NULL, NULL, "
                    f"2.0, 0)", seq, status, "7" if status == "completed" else None)
            await conn.execute(f"INSERT INTO {s}.signals VALUES ('old-run', 'cb', '\"yes\"', 1.0)")
            await conn.execute(f"INSERT INTO {s}.events (run_id, type, data, ts) VALUES ('old-run', 'e', '{{}}', 1.0)")

    await _sql(postgres_dsn, make_v1)
    store = await PostgresStore.connect(postgres_dsn)
    try:
        assert await store.migrate() == postgres_schema.SCHEMA_VERSION  # connect migrated it already
        run = await store.get_run("old-run")
        assert run is not None and run.input == {"n": 1} and run.fence == 3
        rows = await store.load_journal("old-run")
        assert [(r.seq, r.op_id, r.status, r.result) for r in rows] == [(1, "a", "started", None), (2, "a", "completed", 7)]
        assert await store.get_signals("old-run") == {"cb": "yes"}
        assert [e.type for e in await store.read_events("old-run")] == ["e"]
        lease = await store.claim("old-run", "w", 30)
        assert lease.fence == 4
        more = [_rec("b", 8)]
        await store.commit("old-run", lease.fence, Commit(more))
        assert more[0].seq == 3, "the journal goes on after the rows version 1 wrote"
    finally:
        await store.close()
    version = await _sql(postgres_dsn, lambda c, s: c.fetchval(f"SELECT value FROM {s}.meta WHERE key='schema_version'"))
    assert version == str(postgres_schema.SCHEMA_VERSION)


async def test_a_schema_newer_than_this_code_is_refused(postgres_dsn: str) -> None:
    async def make_future(conn: Any, s: str) -> None:
        for statement in postgres_schema.prelude(s):
            await conn.execute(statement)
        await conn.execute(f"INSERT INTO {s}.meta VALUES ('schema_version', '99')")

    await _sql(postgres_dsn, make_future)
    with pytest.raises(StoreError, match="version 99, newer than this durable-sandbox knows"):
        await PostgresStore.connect(postgres_dsn)


async def test_processes_creating_the_schema_at_once_both_get_it(postgres_dsn: str) -> None:
    stores = await asyncio.gather(*(PostgresStore.connect(postgres_dsn) for _ in range(4)))
    try:
        await stores[0].create_run(RunRecord(run_id="r", workflow="wf"))
        assert all([await s.get_run("r") is not None for s in stores])
    finally:
        for s in stores:
            await s.close()


async def test_a_run_whose_row_was_deleted_behind_the_store_is_not_created_afresh_over_its_journal(
    store: PostgresStore, postgres_dsn: str
) -> None:
    """Its journal rows say it ran: creating it again would execute every committed step again. A run deleted
    whole (``delete_run``: the Workflow's cleanup, ``dsb prune``) leaves nothing behind and may be created anew."""
    run, _ = await store.create_run(RunRecord(run_id="ran", workflow="wf"))
    lease = await store.claim(run.run_id, "w", 60)
    await store.commit(run.run_id, lease.fence, Commit([_rec("a", 1)]))
    await _sql(postgres_dsn, lambda conn, s: conn.execute(f"DELETE FROM {s}.runs WHERE run_id='ran'"))
    with pytest.raises(JournalDamaged, match="journal rows are there but the run's row is missing") as caught:
        await store.create_run(RunRecord(run_id="ran", workflow="wf"))
    assert caught.value.lost and not caught.value.tampered and caught.value.reason == "JournalLost"

    await store.create_run(RunRecord(run_id="whole", workflow="wf"))
    assert await store.delete_run("whole")
    assert (await store.create_run(RunRecord(run_id="whole", workflow="wf")))[1]


# ------------------------------------------------------------------------------------------- the server away


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_commit_waits_for_the_server_to_come_back_and_lands_once(
    postgres_server: PostgresServer, store: PostgresStore, mode: str
) -> None:
    """The server stops (cleanly, or as a crash) between two commits: the next commit waits for it, then
    lands once; everything committed before is there (a crash replays the WAL)."""
    await store.create_run(RunRecord(run_id="r", workflow="wf"))
    lease = await store.claim("r", "w", 600)
    await store.commit("r", lease.fence, Commit([_rec("a", 1)]))
    await asyncio.to_thread(postgres_server.stop, mode)
    pending = asyncio.create_task(store.commit("r", lease.fence, Commit([_rec("b", 2)])))
    await _wait_for(lambda: store.outages == 1, "the store to meet the outage")
    assert not pending.done(), "the commit must wait for the server, not fail"
    await asyncio.to_thread(postgres_server.start)
    await asyncio.wait_for(pending, 60)
    rows = await store.load_journal("r")
    assert [(r.seq, r.op_id, r.result) for r in rows] == [(1, "a", 1), (2, "b", 2)]


async def test_an_outage_longer_than_the_store_waits_is_store_unavailable(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    store = await PostgresStore.connect(postgres_dsn, outage_timeout=0.5)
    try:
        await store.create_run(RunRecord(run_id="r", workflow="wf"))
        lease = await store.claim("r", "w", 600)
        await asyncio.to_thread(postgres_server.stop)
        try:
            with pytest.raises(StoreUnavailable) as info:
                await store.commit("r", lease.fence, Commit([_rec("a", 1)]))
        finally:
            await asyncio.to_thread(postgres_server.start)
        assert postgres_server.password not in str(info.value)
        assert "did not answer for 0.5s" in str(info.value)
        assert await store.load_journal("r") == [], "a commit that raised must not have landed"
    finally:
        await store.close()


@pytest.mark.parametrize("landed", [True, False], ids=["answer-lost", "request-lost"])
async def test_a_commit_whose_outcome_is_unknown_is_neither_lost_nor_doubled(
    postgres_server: PostgresServer, postgres_dsn: str, landed: bool
) -> None:
    """A proxy between the store and the server cuts the connection on the commit: after the server answered
    it (the answer is lost) or before the request reached the server. The store sends it again; the journal
    has each record once, with the seqs the store returned."""
    _, schema = split_dsn(postgres_dsn)
    async with CuttingProxy("127.0.0.1", postgres_server.port) as proxy:
        dsn = postgres_server.dsn().replace(f":{postgres_server.port}/", f":{proxy.port}/") + f"?schema={schema}"
        store = await PostgresStore.connect(dsn, pool_size=1)
        try:
            await store.create_run(RunRecord(run_id="r", workflow="wf"))
            lease = await store.claim("r", "w", 600)
            # The same statement once before, so the cut meets its execution, not its preparation.
            await store.commit("r", lease.fence, Commit([_rec("before", 0)]))
            proxy.cut_next("after-answer" if landed else "before-request")
            records = [_rec("x", 1), _rec("y", 2)]
            await store.commit("r", lease.fence, Commit(records))
            assert proxy.cuts == 1 and store.outages == 1
            assert [r.seq for r in records] == [2, 3]
            await store.commit("r", lease.fence, Commit([_rec("after", 3)]))
            rows = await store.load_journal("r")
            assert [(r.seq, r.op_id) for r in rows] == [(1, "before"), (2, "x"), (3, "y"), (4, "after")]
        finally:
            await store.close()


async def test_a_lease_released_while_a_claim_reads_its_holder_is_claimed_not_reported_held_by_nobody(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI: the claim's UPDATE found the run held; its holder released before the claim's SELECT read who holds
    it, and the claim raised a TypeError (a LeaseHeld with no expiry) instead of claiming the free run."""
    from durable_sandbox.engine.errors import LeaseHeld

    await store.create_run(RunRecord(run_id="r", workflow="wf"))
    held = await store.claim("r", "holder", 600)
    real_call = store._call
    released: list[bool] = []

    async def call_releasing_after_the_update(what: str, fn: Any, run_id: str | None = None) -> Any:
        if what != "claiming a run":
            return await real_call(what, fn, run_id)

        async def on(conn: Any) -> Any:
            real_fetchrow = conn.fetchrow

            class Conn:
                async def fetchrow(self, sql: str, *args: Any) -> Any:
                    row = await real_fetchrow(sql, *args)
                    if sql.lstrip().startswith("UPDATE") and row is None and not released:
                        await store.release(held)  # the holder lets go between the UPDATE and the SELECT
                        released.append(True)
                    return row

            return await fn(Conn())

        return await real_call(what, on, run_id)

    monkeypatch.setattr(store, "_call", call_releasing_after_the_update)
    lease = await store.claim("r", "claimer", 600)
    assert released and lease.owner == "claimer" and lease.fence == held.fence + 1
    with pytest.raises(LeaseHeld) as raised:  # a live holder is still reported, with its real expiry
        await store.claim("r", "third", 600)
    assert raised.value.owner == "claimer" and raised.value.remaining > 500


# ------------------------------------------------------------------------------------------- errors


async def test_errors_name_the_store_without_its_password(postgres_server: PostgresServer) -> None:
    wrong = postgres_server.dsn().replace(postgres_server.password, "not-the-password-s3cr3t")
    with pytest.raises(StoreError) as info:
        await PostgresStore.connect(wrong)
    text = str(info.value)
    assert "not-the-password-s3cr3t" not in text and "password authentication failed" in text
    assert f"127.0.0.1:{postgres_server.port}" in text
    with pytest.raises(StoreError, match="not a lowercase SQL identifier"):
        await PostgresStore.connect(postgres_server.dsn() + "?schema=Robert'); DROP TABLE x;--")
    with pytest.raises(StoreError) as info:
        await PostgresStore.connect(postgres_server.dsn().replace(str(postgres_server.port), "1"), connect_timeout=2)
    assert postgres_server.password not in str(info.value) and "Cannot connect" in str(info.value)


async def test_a_server_that_refuses_for_good_is_a_refusal_that_says_what_to_do(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    """A privilege taken away, a role that may only read: StoreRefused (the run stops where it is and its owner
    says why, the operator as JournalWriteRefused), not a bare StoreError that crashes whoever called."""
    owner = await PostgresStore.connect(postgres_dsn)
    await owner.create_run(RunRecord("r1", "wf"))
    real, schema = split_dsn(postgres_dsn)
    role = f"reader_{schema}"
    secret = "reader-pw-s3cr3t"

    async def limited(conn: Any, s: str) -> None:
        await conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{secret}'")
        await conn.execute(f"GRANT USAGE ON SCHEMA {s} TO {role}")
        await conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {role}")

    await _sql(postgres_dsn, limited)
    pool = await asyncpg.create_pool(real.replace(f"postgres:{postgres_server.password}@", f"{role}:{secret}@"),
                                     min_size=1, max_size=1)
    reader = PostgresStore(pool, postgres_dsn, schema)
    try:
        assert (await reader.get_run("r1")) is not None  # reading is allowed
        with pytest.raises(StoreRefused) as info:
            await reader.create_run(RunRecord("r2", "wf"))
        text = str(info.value)
        assert "SQLSTATE 42501" in text and "grant the store's role" in text, text
        assert secret not in text and postgres_server.password not in text

        async def read_only(conn: Any, s: str) -> None:
            await conn.execute(f"GRANT INSERT ON ALL TABLES IN SCHEMA {s} TO {role}")
            await conn.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")

        await _sql(postgres_dsn, read_only)
        await pool.expire_connections()  # a role's settings apply to new sessions
        with pytest.raises(StoreRefused, match=r"SQLSTATE 25006.*point the URL at the primary"):
            await reader.create_run(RunRecord("r3", "wf"))
        assert [r.run_id for r in await owner.list_runs()] == ["r1"]  # nothing was recorded
    finally:
        await pool.close()
        await owner.close()

        async def drop(conn: Any, s: str) -> None:
            await conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {role}")
            await conn.execute(f"REVOKE ALL ON SCHEMA {s} FROM {role}")
            await conn.execute(f"DROP ROLE {role}")

        await _sql(postgres_dsn, drop)


# ------------------------------------------------------------------------------------------- pooling


async def test_many_runs_committing_at_once_share_a_bounded_pool(postgres_server: PostgresServer, postgres_dsn: str) -> None:
    """20 runs commit at once through a pool of 3: every commit lands, in order per run, and the store never
    holds more than 3 connections to the server."""
    store = await PostgresStore.connect(postgres_dsn, pool_size=3)
    try:
        leases = []
        for i in range(20):
            await store.create_run(RunRecord(run_id=f"r{i}", workflow="wf"))
            leases.append(await store.claim(f"r{i}", "w", 600))
        peak = 0

        async def connections() -> int:
            return int(await _sql(postgres_dsn, lambda c, s: c.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'durable-sandbox' "
                "AND pid <> pg_backend_pid()")))

        async def commits(lease: Any) -> None:
            nonlocal peak
            for k in range(5):
                await store.commit(lease.run_id, lease.fence, Commit([_rec(f"s{k}", k)]))
            peak = max(peak, await connections())

        await asyncio.gather(*(commits(lease) for lease in leases))
        for lease in leases:
            rows = await store.load_journal(lease.run_id)
            assert [(r.seq, r.op_id) for r in rows] == [(k + 1, f"s{k}") for k in range(5)]
        assert 1 <= peak <= 3, f"{peak} connections for a pool of 3"
    finally:
        await store.close()


# ------------------------------------------------------------------------------------------- the harness


def test_a_server_whose_test_session_died_is_stopped_and_deleted_by_the_next() -> None:
    """A session killed before its teardown leaves its server running; the next session's fixture stops it."""
    import json
    import shutil
    import subprocess
    import tempfile

    from tests.postgres.fixtures import OWNER_FILE, PREFIX, reap_abandoned

    base = Path(tempfile.mkdtemp(prefix="dsb-reap-test-"))  # not under pytest's 0700 tmp: the server user enters it
    base.chmod(0o711)
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        orphan = base / f"{PREFIX}orphan"
        server = PostgresServer(orphan).up()
        (orphan / OWNER_FILE).write_text(json.dumps({"pid": dead.pid, "start": "0"}))
        alive = base / f"{PREFIX}alive"
        alive.mkdir()
        (alive / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "start": _own_start()}))
        pid = server.pid()
        assert pid is not None and server.running()
        assert reap_abandoned(base) == [orphan]
        assert not orphan.exists() and alive.exists()
        assert not Path(f"/proc/{pid}").exists() or b"postgres" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _own_start() -> str:
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[19]


# ------------------------------------------------------------------------------------------- a worker and an outage


async def test_a_worker_outlives_an_outage_longer_than_the_store_waits(
    postgres_server: PostgresServer, postgres_dsn: str, tmp_path: Path
) -> None:
    """`dsb worker`'s loop (poll_store) while the server is down past the store's wait: it neither dies nor takes
    the outage for "nothing runnable" (--until-idle would exit); once the server is back it runs the pending run."""
    from durable_sandbox.engine import Engine
    from tests.postgres.flows import counted

    store = await PostgresStore.connect(postgres_dsn, outage_timeout=0.2)
    engine = Engine(store)
    try:
        log = tmp_path / "steps.log"
        await engine.create(counted, {"log": str(log), "steps": 2}, run_id="later")
        await asyncio.to_thread(postgres_server.stop)
        try:
            worker = asyncio.create_task(engine.worker(concurrency=1, poll_interval=0.05, idle_exit=True))
            await _wait_for(lambda: store.outages >= 3, "the worker to meet the outage three times")
            assert not worker.done(), "the worker must keep polling while the store is away"
        finally:
            await asyncio.to_thread(postgres_server.start)
        assert await asyncio.wait_for(worker, 120) == ["later"]
        assert log.read_text().split("\n")[:2] == [f"later 0 {os.getpid()}", f"later 1 {os.getpid()}"]
    finally:
        await engine.aclose()
        await store.close()
