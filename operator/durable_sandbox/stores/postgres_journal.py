"""The PostgreSQL store's journal: the fenced, atomic commit, the journal read back in commit order, and what
commits write beside it (cache, thread state).

A commit is ``UPDATE runs ... WHERE fence = mine [AND no cancel request] RETURNING last_seq`` with the journal
rows, thread state and cache entry inserted by data-modifying CTEs that select from that UPDATE: they land with it
or not at all. The UPDATE takes the run row's lock, so a commit and a claim (which moves the fence) are
serialized: a stale holder's commit either lands before the claim (and the new holder reads it) or finds the new
fence and writes nothing. The records' seqs are the run's ``last_seq`` + 1, + 2, ...: per run, dense, in commit
order. A commit whose answer was lost is sent again with the same token (``runs.last_token``): if the first one
landed, the second writes nothing and the store returns the first one's seqs.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from durable_sandbox.engine.errors import StoreError
from durable_sandbox.engine.records import Commit, OperationRecord, RunRecord
from durable_sandbox.stores.postgres_runs import PostgresRuns
from durable_sandbox.stores.sql_rows import OP_COLUMNS, cache_row, op_from_row, op_row, thread_row
from durable_sandbox.stores.sql_rules import refuse_unfenced, set_values

__all__ = ["PostgresJournal"]

_OP_COLUMNS = ", ".join(OP_COLUMNS)
_CommitShape = tuple[bool, tuple[str, ...], bool, bool, bool]


def _ops_part(s: str, a: int) -> str:
    """The CTE inserting a commit's records, from 11 arrays numbered from ``$a`` (op_row's order)."""
    return (
        f"o AS (INSERT INTO {s}.ops (run_id, seq, op_id, kind, name, status, attempt, digest, result, "
        f"error, meta, ts, epoch) SELECT $1, r.last_seq - $3 + u.ord, u.op_id, u.kind, u.name, u.status, "
        f"u.attempt, u.digest, u.result, u.error, u.meta, u.ts, u.epoch FROM r, unnest("
        f"${a}::text[], ${a + 1}::text[], ${a + 2}::text[], ${a + 3}::text[], ${a + 4}::int[], "
        f"${a + 5}::text[], ${a + 6}::text[], ${a + 7}::text[], ${a + 8}::text[], "
        f"${a + 9}::double precision[], ${a + 10}::int[]) WITH ORDINALITY AS u(op_id, kind, name, status, "
        f"attempt, digest, result, error, meta, ts, epoch, ord))"
    )


def _thread_part(s: str, a: int) -> str:
    return (
        f"t AS (INSERT INTO {s}.threads (thread_id, state, updated_at) SELECT ${a}, ${a + 1}, "
        f"${a + 2}::double precision FROM r ON CONFLICT (thread_id) DO UPDATE SET state = excluded.state, "
        f"updated_at = excluded.updated_at)"
    )


def _cache_part(s: str, a: int) -> str:
    return (
        f"c AS (INSERT INTO {s}.cache (key, value, created_at, expires_at) SELECT ${a}, ${a + 1}, "
        f"${a + 2}::double precision, ${a + 3}::double precision FROM r ON CONFLICT (key) DO UPDATE "
        f"SET value = excluded.value, created_at = excluded.created_at, expires_at = excluded.expires_at)"
    )


def _commit_args(run_id: str, fence: int, token: int, commit: Commit) -> list[Any]:
    """The commit statement's parameters, in the order :meth:`PostgresJournal._commit_statement` numbers them."""
    records = commit.records
    args: list[Any] = [run_id, fence, len(records), token]
    now = time.time()
    if commit.run:
        args += set_values(commit.run, now)
    if records:
        args += [list(column) for column in zip(*(op_row(r) for r in records), strict=True)]
    if commit.thread_state is not None:
        args += thread_row(commit.thread_state, now)
    if commit.cache is not None:
        args += cache_row(commit.cache, now)
    return args


def _number(commit: Commit, last: int) -> None:
    """The committed records' seqs, from the run's last seq after the commit."""
    n = len(commit.records)
    for i, rec in enumerate(commit.records):
        rec.seq = last - n + 1 + i


class PostgresJournal(PostgresRuns):
    def __init__(self, pool: Any, dsn: str, schema: str, *, outage_timeout: float | None = None) -> None:
        super().__init__(pool, dsn, schema, outage_timeout=outage_timeout)
        self._commit_sql: dict[_CommitShape, str] = {}  # one statement per shape of commit, built once

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
        for present, part, count in ((commit.records, _ops_part, 11), (commit.thread_state is not None, _thread_part, 3),
                                     (commit.cache is not None, _cache_part, 4)):
            if present:
                parts.append(part(s, n + 1))
                n += count
        sql = "WITH " + ", ".join(parts) + " SELECT last_seq FROM r"
        self._commit_sql[shape] = sql
        return sql

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        sql, token = self._commit_statement(commit), random.getrandbits(63)
        args = _commit_args(run_id, fence, token, commit)
        last = await self._call("committing to the journal",
                                lambda conn: self._commit_on(conn, sql, args, run_id, fence, token, commit), run_id)
        _number(commit, last)

    async def commit_with_new_run(self, run_id: str, fence: int, commit: Commit, new_run: RunRecord) -> None:
        """``commit`` and the creation of ``new_run`` in one transaction (engine/store.py ``CommitsWithNewRun``).
        Offered again after a lost answer, the commit finds its token and the run it created: it writes nothing."""
        sql, token = self._commit_statement(commit), random.getrandbits(63)
        args = _commit_args(run_id, fence, token, commit)

        async def run_it(conn: Any) -> int:
            async with conn.transaction():
                last = await self._commit_on(conn, sql, args, run_id, fence, token, commit)
                await self._create_run_on(conn, new_run)
                return last

        _number(commit, await self._call("ending a run and creating the next", run_it, run_id))

    async def _commit_on(self, conn: Any, sql: str, args: list[Any], run_id: str, fence: int, token: int,
                         commit: Commit) -> int:
        """The commit statement on ``conn``: the run's last seq after it (its own, or a first attempt's)."""
        last = await conn.fetchval(sql, *args)
        if last is not None:
            return int(last)
        # Nothing written: a stale fence, a cancel request, or (this being a retry) it landed already.
        row = await conn.fetchrow(
            f"SELECT fence, cancel_requested, last_token, last_seq FROM {self.schema}.runs WHERE run_id=$1", run_id)
        if row is not None and row["last_token"] == token:
            return int(row["last_seq"])
        refuse_unfenced(run_id, fence, (row["fence"], row["cancel_requested"]) if row else None, commit.check_cancel)
        raise StoreError(f"PostgreSQL store {self.where}: a commit to run {run_id!r} wrote nothing for no "
                         f"reason the store knows")  # pragma: no cover - every case is above

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self.journal_since(run_id, 0)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        rows = await self._call("reading the journal", lambda c: c.fetch(
            f"SELECT {_OP_COLUMNS} FROM {self.schema}.ops WHERE run_id=$1 AND seq>$2 ORDER BY seq",
            run_id, after_seq), run_id)
        return [op_from_row(r, run_id, f"PostgreSQL store {self.where}") for r in rows]

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
