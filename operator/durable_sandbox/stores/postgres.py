"""``PostgresStore``: the engine's store in PostgreSQL, for workers on many machines and journals that
outgrow one file or the API server. ``await PostgresStore.connect("postgresql://user:pw@host/db")``.

On asyncpg (docs/architecture.md says why): a pool of connections, statements prepared once per
connection. Every write is one statement, so one round trip and its own transaction:

- **commit** is ``UPDATE runs ... WHERE fence = mine [AND no cancel request] RETURNING last_seq`` with the
  journal rows, thread state and cache entry inserted by data-modifying CTEs that select from that
  UPDATE: they land with it or not at all. The UPDATE takes the run row's lock, so a commit and a claim
  (which moves the fence) are serialized: a stale holder's commit either lands before the claim (and the
  new holder reads it) or finds the new fence and writes nothing. The records' seqs are the run's
  ``last_seq`` + 1, + 2, ...: per run, dense, in commit order.
- **claim/renew/release/claim_next** compare lease expiry with the *server's* clock, the one clock every
  worker of the store shares. ``claim_next`` picks with ``FOR UPDATE SKIP LOCKED``: two workers never
  hand out the same run, and neither waits for the other.

**When the server is away** (a restart, a failover, the network): every call retries with backoff for up
to ``outage_timeout`` seconds (the runs pause at their next commit, which is the next call boundary), then
raises ``StoreUnavailable``, which the engine handles as a lost lease: the worker stops executing the run
without writing, and the run resumes from its journal when claimed again. A commit whose answer was lost
is sent again with the same token (``runs.last_token``): if the first one landed, the second writes
nothing and the store returns the first one's seqs, so no record is lost or written twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from durable_sandbox.engine.errors import (
    JournalDamaged,
    LeaseHeld,
    LeaseLost,
    RunCancelledError,
    RunNotFound,
    SignalConflict,
    StoreError,
    StoreRefused,
    StoreUnavailable,
)
from durable_sandbox.engine.records import (
    Commit,
    Event,
    Lease,
    OperationRecord,
    RunRecord,
    RunStatus,
)
from durable_sandbox.providers.redaction import redact_url
from durable_sandbox.stores import postgres_schema as schema_mod
from durable_sandbox.stores.sql_rows import (
    OP_COLUMNS,
    RUN_COLUMNS,
    canonical,
    change_value,
    dumps,
    op_cells,
    op_from_row,
    run_from_row,
    run_values,
)
from durable_sandbox.stores.urls import is_postgres_url

log = logging.getLogger("durable_sandbox.stores.postgres")

T = TypeVar("T")

OUTAGE_TIMEOUT = 60.0  # how long a call waits for the server to come back before StoreUnavailable
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 1.0

_RUN_SELECT = ", ".join(RUN_COLUMNS)
# What update_run and a commit's run changes may set (never the run id, the fence or the journal's counter).
_SETTABLE = {"workflow", "status", "input", "result", "error", "thread_id", "created_at", "wake_at",
             "pending_callbacks", "cancel_requested", "epoch", "lease_owner", "lease_expires_at", "labels",
             "workflow_ref"}
_OP_COLUMNS = ", ".join(OP_COLUMNS)
_SERVER_NOW = "extract(epoch from clock_timestamp())::double precision"
# SQLSTATEs that mean "the server is away or turning us away for now", not "this request is wrong".
_OUTAGE_STATES = {"57P01", "57P02", "57P03", "53300", "40001", "40P01"}
# SQLSTATEs (or their classes, two characters) that mean "the server refuses this for good, until someone acts":
# a privilege taken away, the login refused, the disk full, a standby that takes no writes, a value over a
# limit, the schema or database dropped. Raised as StoreRefused: the run stops where it is, nothing recorded,
# and its owner says why (the operator: JournalWriteRefused, retried later), never a crash or the run's failure.
_REFUSED_STATES = {"42501", "25006", "3D000", "3F000", "42P01"}
_REFUSED_CLASSES = {"28", "53", "54"}
_REFUSAL_HINTS = {
    "42501": "grant the store's role USAGE on its schema and SELECT, INSERT, UPDATE, DELETE on its tables",
    "25006": "the server takes no writes (a standby, or default_transaction_read_only): point the URL at the primary",
    "28": "the server refused the login: check the role and its password ($PGPASSWORD, ~/.pgpass, the Secret)",
    "53": "the server is out of a resource (disk, memory): free it",
    "54": "a value is over one of the server's limits",
    "3D000": "the database is gone: create it, or point the URL at another",
    "3F000": "the store's schema is gone: it is created again only by a new connection; restart the process",
    "42P01": "a table of the store's schema is gone: restore the schema from a backup",
}


def split_dsn(dsn: str) -> tuple[str, str]:
    """(the DSN asyncpg gets, the schema): our own ``schema`` query parameter is taken out of the DSN."""
    parts = urlsplit(dsn)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in pairs if k == "schema"), schema_mod.DEFAULT_SCHEMA)
    rest = urlencode([(k, v) for k, v in pairs if k != "schema"])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), schema


def _is_outage(exc: BaseException, conn: Any = None) -> bool:
    if isinstance(exc, (OSError, asyncpg.PostgresConnectionError)):
        return True
    if isinstance(exc, asyncpg.PostgresError) and getattr(exc, "sqlstate", None) in _OUTAGE_STATES:
        return True
    # "connection was closed in the middle of operation" and friends: whatever it was, it did not finish.
    return isinstance(exc, asyncpg.InterfaceError) and conn is not None and conn.is_closed()


async def _no_reset(conn: Any) -> None:
    """The pool's reset on release (asyncpg's default is a round trip per release: RESET ALL, UNLISTEN, ...).
    This store sets no session state, so there is nothing to reset; asyncpg still rolls back an open
    transaction itself."""


class PostgresStore:
    def __init__(self, pool: Any, dsn: str, schema: str, *, outage_timeout: float | None = None) -> None:
        """Use :meth:`connect`."""
        self._pool = pool
        self.dsn = dsn
        self.schema = schema
        self.where = redact_url(dsn)  # names the schema too when it is not the default (?schema=...)
        self.outage_timeout = OUTAGE_TIMEOUT if outage_timeout is None else outage_timeout
        self.outages = 0  # outages met (a call that had to wait for the server), for tests and logs
        self._commit_sql: dict[tuple[Any, ...], str] = {}
        s = schema
        self._sql_claim = (
            f"UPDATE {s}.runs SET lease_owner=$2, lease_expires_at={_SERVER_NOW} + $3, fence=fence+1 "
            f"WHERE run_id=$1 AND (lease_owner IS NULL OR lease_owner=$2 OR lease_expires_at IS NULL "
            f"OR lease_expires_at <= {_SERVER_NOW} OR lease_owner=$4) RETURNING fence, lease_expires_at"
        )

    def __str__(self) -> str:
        return self.where

    @property
    def pool(self) -> Any:
        """The connection pool, for stores of other schemas on the same server (the operator's namespaces)."""
        return self._pool

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        pool_size: int = 10,
        outage_timeout: float | None = None,
        connect_timeout: float = 10.0,
    ) -> PostgresStore:
        """Open a pool on ``dsn`` (``postgresql://user:password@host:port/database[?schema=name]``), create or
        migrate the schema, and return the store. ``StoreError`` says what was wrong (the DSN redacted).
        ``outage_timeout``: how long a call waits for a server that went away (default ``OUTAGE_TIMEOUT``)."""
        if not is_postgres_url(dsn):
            raise StoreError(f"{redact_url(dsn)} is not a PostgreSQL URL (postgresql://user:password@host/db)")
        real_dsn, schema = split_dsn(dsn)
        where = redact_url(dsn)
        try:
            schema_mod.check_schema_name(schema)
        except ValueError as exc:
            raise StoreError(f"PostgreSQL store {where}: {exc}") from None
        try:
            pool = await asyncpg.create_pool(
                real_dsn, min_size=1, max_size=pool_size, reset=_no_reset, timeout=connect_timeout,
                max_inactive_connection_lifetime=60.0, server_settings={"application_name": "durable-sandbox"},
            )
        except Exception as exc:
            raise StoreError(f"Cannot connect to the PostgreSQL store {where}: {_describe(exc)}") from None
        store = cls(pool, dsn, schema, outage_timeout=outage_timeout)
        try:
            await store.migrate()
        except BaseException:
            await pool.close()
            raise
        return store

    # ------------------------------------------------------------------ plumbing

    async def _call(self, what: str, fn: Callable[[Any], Awaitable[T]], run_id: str | None = None) -> T:
        """Run ``fn(connection)``; while the server is away, wait for it (see the module's docstring)."""
        deadline: float | None = None
        delay = _BACKOFF_FIRST
        while True:
            conn = None
            try:
                async with self._pool.acquire() as conn:
                    return await fn(conn)
            except asyncpg.PostgresError as exc:
                if not _is_outage(exc, conn):
                    refusal = _refusal(exc, f"PostgreSQL store {self.where}: {what}: {_describe(exc)}")
                    if isinstance(refusal, StoreRefused):
                        # A session keeps what it started with (a role's read-only default, its search path):
                        # the next attempt must log in afresh to see the refusal lifted.
                        await self._pool.expire_connections()
                    raise refusal from None
                error: BaseException = exc
            except (OSError, asyncpg.InterfaceError) as exc:
                if not _is_outage(exc, conn):
                    raise
                error = exc
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.outage_timeout
                self.outages += 1
                await self._pool.expire_connections()  # every idle connection is as dead as this one
                log.warning("PostgreSQL store %s unreachable (%s: %s); waiting up to %.0fs for it",
                            self.where, what, _describe(error), self.outage_timeout)
            if now >= deadline:
                raise StoreUnavailable(
                    f"PostgreSQL {self.where} did not answer for {self.outage_timeout:g}s ({what}: "
                    f"{_describe(error)})", run_id
                ) from None
            await asyncio.sleep(min(delay, max(deadline - now, 0.0)))
            delay = min(delay * 2, _BACKOFF_MAX)

    async def migrate(self) -> int:
        """Create the schema or bring it to ``SCHEMA_VERSION``; returns the version found before."""
        s = self.schema

        async def run(conn: Any) -> int:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", schema_mod.lock_key(s))
                for statement in schema_mod.prelude(s):
                    await conn.execute(statement)
                found = await conn.fetchval(f"SELECT value FROM {s}.meta WHERE key='schema_version'")
                current = int(found) if found is not None else 0
                if current > schema_mod.SCHEMA_VERSION:
                    raise StoreError(
                        f"PostgreSQL store {self.where}: its schema is version {current}, newer than this "
                        f"durable-sandbox knows ({schema_mod.SCHEMA_VERSION}); upgrade durable-sandbox"
                    )
                for statement in schema_mod.steps(s, current):
                    await conn.execute(statement)
                if current != schema_mod.SCHEMA_VERSION:
                    await conn.execute(
                        f"INSERT INTO {s}.meta VALUES ('schema_version', $1) ON CONFLICT (key) DO UPDATE "
                        f"SET value = excluded.value", str(schema_mod.SCHEMA_VERSION))
                    log.info("PostgreSQL store %s: schema migrated from version %d to %d", self.where, current,
                             schema_mod.SCHEMA_VERSION)
                return current

        return await self._call("migrating the schema", run)

    # ------------------------------------------------------------------ runs

    def _run_from_row(self, row: Sequence[Any]) -> RunRecord:
        return run_from_row(row, f"PostgreSQL store {self.where}")

    async def create_run(self, run: RunRecord) -> tuple[RunRecord, bool]:
        s = self.schema
        values = run_values(run)
        params = ", ".join(f"${i}" for i in range(1, len(values) + 1))

        async def run_it(conn: Any) -> tuple[RunRecord, bool]:
            # Never over a journal left without its run (its row deleted behind the store's back): the run ran,
            # and starting it afresh would execute every committed step and call again.
            if await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {s}.ops WHERE run_id=$1) AND NOT EXISTS "
                                   f"(SELECT 1 FROM {s}.runs WHERE run_id=$1)", run.run_id):
                raise JournalDamaged(
                    run.run_id, f"PostgreSQL store {self.where}",
                    "its journal rows are there but the run's row is missing (deleted behind the store's back)",
                    tampered=False, lost=True)
            inserted = await conn.fetchval(
                f"INSERT INTO {s}.runs ({_RUN_SELECT}) VALUES ({params}) ON CONFLICT (run_id) DO NOTHING "
                f"RETURNING true", *values)
            if inserted:
                return run, True
            row = await conn.fetchrow(f"SELECT {_RUN_SELECT} FROM {s}.runs WHERE run_id=$1", run.run_id)
            if row is None:  # deleted in between: say it exists no more than it did
                raise StoreError(f"PostgreSQL store {self.where}: run {run.run_id!r} was deleted while being "
                                 f"created; create it again")
            return self._run_from_row(row), False

        return await self._call("creating a run", run_it, run.run_id)

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._call("reading a run", lambda c: c.fetchrow(
            f"SELECT {_RUN_SELECT} FROM {self.schema}.runs WHERE run_id=$1", run_id), run_id)
        return self._run_from_row(row) if row is not None else None

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        where: list[str] = []
        args: list[Any] = []
        if status:
            args.append([RunStatus(x).value for x in status])
            where.append(f"status = ANY(${len(args)}::text[])")
        if workflow:
            args.append(workflow)
            where.append(f"workflow = ${len(args)}")
        args.append(limit)
        sql = (f"SELECT {_RUN_SELECT} FROM {self.schema}.runs" + (" WHERE " + " AND ".join(where) if where else "")
               + f" ORDER BY created_at DESC LIMIT ${len(args)}")
        rows = await self._call("listing runs", lambda c: c.fetch(sql, *args))
        return [self._run_from_row(r) for r in rows]

    @staticmethod
    def _set_clauses(keys: Sequence[str], first: int) -> list[str]:
        """SET clauses for run fields ``keys`` then ``updated_at``, parameters numbered from ``$first``."""
        for key in keys:
            if key not in _SETTABLE:
                raise ValueError(f"not a run field that can be changed: {key!r}")
        return [f"{key}=${first + i}" for i, key in enumerate((*keys, "updated_at"))]

    @staticmethod
    def _change_values(changes: dict[str, Any]) -> list[Any]:
        """The values for :meth:`_set_clauses` of ``changes``' keys, in the same order."""
        return [*(change_value(key, value) for key, value in changes.items()), time.time()]

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        sets, values = self._set_clauses(list(changes), 2), self._change_values(changes)
        sql = f"UPDATE {self.schema}.runs SET {', '.join(sets)} WHERE run_id=$1"
        if fence is not None:
            sql += f" AND fence=${len(values) + 2}"
            values.append(fence)

        async def run_it(conn: Any) -> None:
            status = await conn.execute(sql, run_id, *values)
            if fence is not None and status == "UPDATE 0":
                raise LeaseLost(run_id, fence)

        await self._call("updating a run", run_it, run_id)

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        s = self.schema
        cond = "run_id=$1" + (" AND fence=$2" if fence is not None else "")
        args: tuple[Any, ...] = (run_id,) if fence is None else (run_id, fence)
        # One statement: a reader sees the whole run or nothing of it, never a run without its journal.
        sql = (f"WITH r AS (DELETE FROM {s}.runs WHERE {cond} RETURNING run_id), "
               f"o AS (DELETE FROM {s}.ops WHERE run_id IN (SELECT run_id FROM r)), "
               f"e AS (DELETE FROM {s}.events WHERE run_id IN (SELECT run_id FROM r)), "
               f"g AS (DELETE FROM {s}.signals WHERE run_id IN (SELECT run_id FROM r)) "
               f"SELECT count(*) FROM r")

        async def run_it(conn: Any) -> bool:
            if await conn.fetchval(sql, *args):
                return True
            if fence is not None and await conn.fetchval(f"SELECT true FROM {s}.runs WHERE run_id=$1", run_id):
                raise LeaseLost(run_id, fence)
            return False

        return await self._call("deleting a run", run_it, run_id)

    # ------------------------------------------------------------------ journal

    def _commit_statement(self, commit: Commit) -> str:
        run_keys = tuple(commit.run) if commit.run else ()
        shape = (bool(commit.records), run_keys, commit.thread_state is not None, commit.cache is not None,
                 commit.check_cancel)
        sql = self._commit_sql.get(shape)
        if sql is not None:
            return sql
        s = self.schema
        n = 4  # $1 run id, $2 fence, $3 record count, $4 token
        sets = ["last_seq = last_seq + $3", "last_token = $4"]
        if run_keys:
            change_sets = self._set_clauses(run_keys, n + 1)
            sets += change_sets
            n += len(change_sets)
        cancel = " AND cancel_requested IS NULL" if commit.check_cancel else ""
        parts = [f"r AS (UPDATE {s}.runs SET {', '.join(sets)} WHERE run_id = $1 AND fence = $2 "
                 f"AND last_token IS DISTINCT FROM $4{cancel} RETURNING last_seq)"]
        if commit.records:
            a = n + 1
            n += 11
            parts.append(
                f"o AS (INSERT INTO {s}.ops (run_id, seq, op_id, kind, name, status, attempt, digest, result, "
                f"error, meta, ts, epoch) SELECT $1, r.last_seq - $3 + u.ord, u.op_id, u.kind, u.name, u.status, "
                f"u.attempt, u.digest, u.result, u.error, u.meta, u.ts, u.epoch FROM r, unnest("
                f"${a}::text[], ${a + 1}::text[], ${a + 2}::text[], ${a + 3}::text[], ${a + 4}::int[], "
                f"${a + 5}::text[], ${a + 6}::text[], ${a + 7}::text[], ${a + 8}::text[], "
                f"${a + 9}::double precision[], ${a + 10}::int[]) WITH ORDINALITY AS u(op_id, kind, name, status, "
                f"attempt, digest, result, error, meta, ts, epoch, ord))"
            )
        if commit.thread_state is not None:
            a = n + 1
            n += 3
            parts.append(
                f"t AS (INSERT INTO {s}.threads (thread_id, state, updated_at) SELECT ${a}, ${a + 1}, "
                f"${a + 2}::double precision FROM r ON CONFLICT (thread_id) DO UPDATE SET state = excluded.state, "
                f"updated_at = excluded.updated_at)"
            )
        if commit.cache is not None:
            a = n + 1
            n += 4
            parts.append(
                f"c AS (INSERT INTO {s}.cache (key, value, created_at, expires_at) SELECT ${a}, ${a + 1}, "
                f"${a + 2}::double precision, ${a + 3}::double precision FROM r ON CONFLICT (key) DO UPDATE "
                f"SET value = excluded.value, created_at = excluded.created_at, expires_at = excluded.expires_at)"
            )
        sql = "WITH " + ", ".join(parts) + " SELECT last_seq FROM r"
        self._commit_sql[shape] = sql
        return sql

    @staticmethod
    def _commit_args(run_id: str, fence: int, token: int, commit: Commit) -> list[Any]:
        records = commit.records
        args: list[Any] = [run_id, fence, len(records), token]
        if commit.run:
            args += PostgresStore._change_values(commit.run)
        if records:
            results, errors, metas = zip(*(op_cells(r) for r in records), strict=True)
            args += [
                [r.op_id for r in records], [r.kind for r in records], [r.name for r in records],
                [r.status for r in records], [r.attempt for r in records], [r.input_digest for r in records],
                list(results), list(errors), list(metas), [float(r.ts) for r in records], [r.epoch for r in records],
            ]
        if commit.thread_state is not None:
            tid, state = commit.thread_state
            args += [tid, dumps(state), time.time()]
        if commit.cache is not None:
            key, value, expires = commit.cache
            args += [key, dumps(value), time.time(), expires]
        return args

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        sql = self._commit_statement(commit)
        token = random.getrandbits(63)
        args = self._commit_args(run_id, fence, token, commit)
        n = len(commit.records)
        s = self.schema

        async def run_it(conn: Any) -> int:
            last = await conn.fetchval(sql, *args)
            if last is not None:
                return int(last)
            # Nothing written: a stale fence, a cancel request, or (this being a retry) it landed already.
            row = await conn.fetchrow(
                f"SELECT fence, cancel_requested, last_token, last_seq FROM {s}.runs WHERE run_id=$1", run_id)
            if row is not None and row["last_token"] == token:
                return int(row["last_seq"])
            if row is None or row["fence"] != fence:
                raise LeaseLost(run_id, fence)
            if commit.check_cancel and row["cancel_requested"] is not None:
                raise RunCancelledError(run_id, row["cancel_requested"])
            raise StoreError(f"PostgreSQL store {self.where}: a commit to run {run_id!r} wrote nothing for no "
                             f"reason the store knows")  # pragma: no cover - every case is above

        last = await self._call("committing to the journal", run_it, run_id)
        for i, rec in enumerate(commit.records):
            rec.seq = last - n + 1 + i

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self.journal_since(run_id, 0)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        rows = await self._call("reading the journal", lambda c: c.fetch(
            f"SELECT {_OP_COLUMNS} FROM {self.schema}.ops WHERE run_id=$1 AND seq>$2 ORDER BY seq",
            run_id, after_seq), run_id)
        return [op_from_row(r, run_id, f"PostgreSQL store {self.where}") for r in rows]

    # ------------------------------------------------------------------ leases

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        s = self.schema

        async def run_it(conn: Any) -> Lease:
            row = await conn.fetchrow(self._sql_claim, run_id, owner, float(ttl), take_over_from)
            if row is not None:
                return Lease(run_id, owner, row["fence"], row["lease_expires_at"])
            held = await conn.fetchrow(f"SELECT lease_owner, lease_expires_at FROM {s}.runs WHERE run_id=$1", run_id)
            if held is None:
                raise RunNotFound(run_id)
            raise LeaseHeld(run_id, held["lease_owner"], held["lease_expires_at"])

        return await self._call("claiming a run", run_it, run_id)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        expires = await self._call("renewing a lease", lambda c: c.fetchval(
            f"UPDATE {self.schema}.runs SET lease_expires_at={_SERVER_NOW} + $4 WHERE run_id=$1 AND fence=$2 "
            f"AND lease_owner=$3 RETURNING lease_expires_at", lease.run_id, lease.fence, lease.owner, float(ttl)),
            lease.run_id)
        if expires is None:
            raise LeaseLost(lease.run_id, lease.fence)
        return Lease(lease.run_id, lease.owner, lease.fence, expires)

    async def release(self, lease: Lease) -> None:
        await self._call("releasing a lease", lambda c: c.execute(
            f"UPDATE {self.schema}.runs SET lease_owner=NULL, lease_expires_at=NULL WHERE run_id=$1 AND fence=$2",
            lease.run_id, lease.fence), lease.run_id)

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None) -> Lease | None:
        s = self.schema
        only = " AND workflow = ANY($4::text[])" if workflows else ""
        sql = (
            f"WITH c AS (SELECT run_id FROM {s}.runs WHERE status IN ('pending', 'running', 'waiting', 'suspended') "
            f"AND (lease_owner IS NULL OR lease_expires_at < {_SERVER_NOW}) AND (status IN ('pending', 'running') "
            f"OR (status = 'waiting' AND wake_at IS NOT NULL AND wake_at <= $3) "
            f"OR (cancel_requested IS NOT NULL AND status IN ('waiting', 'suspended'))){only} "
            f"ORDER BY updated_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
            f"UPDATE {s}.runs r SET lease_owner=$1, lease_expires_at={_SERVER_NOW} + $2, fence=r.fence+1 FROM c "
            f"WHERE r.run_id = c.run_id RETURNING r.run_id, r.fence, r.lease_expires_at"
        )
        args: list[Any] = [owner, float(ttl), time.time()]
        if workflows:
            args.append(list(workflows))
        row = await self._call("claiming the next runnable run", lambda c: c.fetchrow(sql, *args))
        return Lease(row["run_id"], owner, row["fence"], row["lease_expires_at"]) if row is not None else None

    # ------------------------------------------------------------------ signals, cache, thread state

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        s = self.schema
        text = dumps(value)

        async def run_it(conn: Any) -> bool:
            if await conn.fetchval(
                f"INSERT INTO {s}.signals VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING true",
                run_id, callback_id, text, time.time(),
            ):
                return True
            stored = await conn.fetchval(
                f"SELECT value FROM {s}.signals WHERE run_id=$1 AND callback_id=$2", run_id, callback_id)
            if stored is not None and canonical(json.loads(stored)) == canonical(value):
                return False
            raise SignalConflict(run_id, callback_id)

        return await self._call("storing a signal", run_it, run_id)

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        rows = await self._call("reading signals", lambda c: c.fetch(
            f"SELECT callback_id, value FROM {self.schema}.signals WHERE run_id=$1", run_id), run_id)
        return {r[0]: json.loads(r[1]) for r in rows}

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        row = await self._call("reading the cache", lambda c: c.fetchrow(
            f"SELECT value, created_at FROM {self.schema}.cache WHERE key=$1 AND (expires_at IS NULL OR "
            f"expires_at > $2)", key, float(now)))
        return (json.loads(row[0]), row[1]) if row is not None else None

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        s = self.schema
        if key is not None:
            sql, args = f"DELETE FROM {s}.cache WHERE key=$1", [key]
        elif prefix is not None:
            sql, args = f"DELETE FROM {s}.cache WHERE left(key, length($1)) = $1", [prefix]
        else:
            sql, args = f"DELETE FROM {s}.cache", []
        status = await self._call("clearing the cache", lambda c: c.execute(sql, *args))
        return int(status.split()[-1])

    async def get_thread_state(self, thread_id: str) -> Any:
        text = await self._call("reading thread state", lambda c: c.fetchval(
            f"SELECT state FROM {self.schema}.threads WHERE thread_id=$1", thread_id))
        return json.loads(text) if text is not None else None

    # ------------------------------------------------------------------ events

    async def append_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        columns = ([e.run_id for e in events], [e.type for e in events], [dumps(e.data) for e in events],
                   [float(e.ts) for e in events])
        await self._call("appending events", lambda c: c.execute(
            f"INSERT INTO {self.schema}.events (run_id, type, data, ts) SELECT u.run_id, u.type, u.data, u.ts "
            f"FROM unnest($1::text[], $2::text[], $3::text[], $4::double precision[]) WITH ORDINALITY "
            f"AS u(run_id, type, data, ts, ord) ORDER BY u.ord", *columns), events[0].run_id)

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        rows = await self._call("reading events", lambda c: c.fetch(
            f"SELECT seq, type, data, ts FROM {self.schema}.events WHERE run_id=$1 AND seq>$2 ORDER BY seq "
            f"LIMIT $3", run_id, after, limit), run_id)
        return [Event(run_id, r[1], json.loads(r[2]), r[3], r[0]) for r in rows]

    # ------------------------------------------------------------------ housekeeping

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._pool.close(), 10)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            self._pool.terminate()


def _refusal(exc: BaseException, message: str) -> StoreError:
    """``exc`` as the store's error: StoreRefused (with what to do) when the server refuses for good."""
    state = str(getattr(exc, "sqlstate", "") or "")
    hint = _REFUSAL_HINTS.get(state) or _REFUSAL_HINTS.get(state[:2])
    if state in _REFUSED_STATES or state[:2] in _REFUSED_CLASSES:
        return StoreRefused(f"{message} (SQLSTATE {state}): {hint}" if hint else f"{message} (SQLSTATE {state})")
    return StoreError(message)


def _describe(exc: BaseException) -> str:
    """An asyncpg or socket error in a line: its text (asyncpg's never carry the password), else its type."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
