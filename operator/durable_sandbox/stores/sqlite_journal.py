"""The SQLite store's journal: fenced, atomic commits (journal records, run changes, thread state and a cache entry
together), the journal read back in commit order, and what commits wrote beside it (cache, thread state).

The step path's commits, of one record or a few (a step's start with its outcome, a call's completion with the
next call's start) and nothing else, are one fenced statement in its own transaction (autocommit) instead of
BEGIN/SELECT/INSERT.../COMMIT: the fence (and cancellation) is checked by the same statement that writes, so a
stale worker can never slip a row in; the rows go in in VALUES order, with consecutive seqs (one statement holds
the write lock).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any, Final

from durable_sandbox.engine.errors import LeaseLost, StoreError
from durable_sandbox.engine.records import Commit, OperationRecord, RunRecord
from durable_sandbox.stores.sql_rows import OP_COLUMNS, cache_row, op_from_row, op_row, thread_row
from durable_sandbox.stores.sqlite_file import explain, wall_clock
from durable_sandbox.stores.sqlite_runs import SqliteRuns

__all__ = ["SqliteJournal"]

_OP_COLUMNS = ", ".join(OP_COLUMNS)
_OP_INSERT = (
    "INSERT INTO ops (run_id, op_id, kind, name, status, attempt, digest, result, error, meta, ts, epoch) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
_OP_FENCED_MAX = 4  # the most records a step-path commit carries (see the module)


def _op_fenced(n: int, check_cancel: bool) -> str:
    rows = ",".join(["(?,?,?,?,?,?,?,?,?,?,?,?)"] * n)
    return (
        "INSERT INTO ops (run_id, op_id, kind, name, status, attempt, digest, result, error, meta, ts, epoch) "
        f"SELECT * FROM (VALUES {rows}) WHERE EXISTS (SELECT 1 FROM runs WHERE run_id=? AND fence=?"
        + (" AND cancel_requested IS NULL)" if check_cancel else ")")
    )


_OP_FENCED: Final[Mapping[tuple[int, bool], str]] = {(n, check): _op_fenced(n, check) for n in range(1, _OP_FENCED_MAX + 1) for check in (False, True)}


class SqliteJournal(SqliteRuns):
    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        records = commit.records
        if (0 < len(records) <= _OP_FENCED_MAX and not commit.run and commit.thread_state is None
                and commit.cache is None):
            self._commit_records(run_id, fence, records, commit.check_cancel)
            return
        with self._tx() as tx:
            self._write(tx, run_id, fence, commit)

    async def commit_with_new_run(self, run_id: str, fence: int, commit: Commit, new_run: RunRecord) -> None:
        """``commit`` and the creation of ``new_run`` in one transaction (engine/store.py ``CommitsWithNewRun``)."""
        with self._tx() as tx:
            self._write(tx, run_id, fence, commit)
            self._create_run_in(tx, new_run)

    def _write(self, tx: sqlite3.Connection, run_id: str, fence: int, commit: Commit) -> None:
        """A commit inside the caller's transaction: fence checked, then everything it carries written."""
        self._check_fence(tx, run_id, fence, commit.check_cancel)
        for r in commit.records:
            r.seq = tx.execute(_OP_INSERT, (run_id, *op_row(r))).lastrowid or 0
        if commit.run:
            self._set_run(tx, run_id, commit.run)
        if commit.thread_state is not None:
            tx.execute(
                "INSERT INTO threads VALUES (?,?,?) ON CONFLICT(thread_id) DO UPDATE SET state=excluded.state, "
                "updated_at=excluded.updated_at",
                thread_row(commit.thread_state, wall_clock()),
            )
        if commit.cache is not None:
            tx.execute("INSERT OR REPLACE INTO cache VALUES (?,?,?,?)", cache_row(commit.cache, wall_clock()))

    def _commit_records(self, run_id: str, fence: int, records: list[OperationRecord], check_cancel: bool) -> None:
        """The step path's commit (see the module): one statement instead of BEGIN/SELECT/INSERT.../COMMIT."""
        self._check_file_now_and_then()
        values = [v for rec in records for v in (run_id, *op_row(rec))]
        try:  # not self._errors(): a context manager costs a few percent of a no-op step here
            cur = self._db.execute(_OP_FENCED[len(records), check_cancel], (*values, run_id, fence))
        except sqlite3.Error as e:
            raise StoreError(f"Store {self.path}: {explain(e)}") from None
        self.checkpoints.after_commit(self._db)
        if cur.rowcount != len(records):
            with self._tx() as tx:
                self._check_fence(tx, run_id, fence, check_cancel)
            raise LeaseLost(run_id, fence)  # pragma: no cover - _check_fence raised already
        for seq, rec in enumerate(records, start=(cur.lastrowid or 0) - len(records) + 1):
            rec.seq = seq

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self.journal_since(run_id, 0)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        rows = self._query(f"SELECT {_OP_COLUMNS} FROM ops WHERE run_id=? AND seq>? ORDER BY seq", (run_id, after_seq))
        return [op_from_row(r, run_id, self._where) for r in rows]

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        rows = self._query(
            "SELECT value, created_at FROM cache WHERE key=? AND (expires_at IS NULL OR expires_at > ?)", (key, now)
        )
        return (json.loads(rows[0][0]), rows[0][1]) if rows else None

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        with self._tx() as db:
            if key is not None:
                cur = db.execute("DELETE FROM cache WHERE key=?", (key,))
            elif prefix is not None:
                cur = db.execute("DELETE FROM cache WHERE substr(key, 1, ?)=?", (len(prefix), prefix))
            else:
                cur = db.execute("DELETE FROM cache")
            return cur.rowcount

    async def get_thread_state(self, thread_id: str) -> Any:
        rows = self._query("SELECT state FROM threads WHERE thread_id=?", (thread_id,))
        return json.loads(rows[0][0]) if rows else None
