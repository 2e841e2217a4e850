"""The SQLite store's runs: create (idempotent), read, list, change (fenced when asked) and delete with everything
the run wrote."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.errors import LeaseLost
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.stores.sql_rows import RUN_COLUMNS, run_from_row, run_values
from durable_sandbox.stores.sql_rules import (
    QmarkParams,
    list_runs_sql,
    refuse_other_run,
    refuse_unfenced,
    set_columns,
    set_values,
)
from durable_sandbox.stores.sqlite_file import SqliteFile, wall_clock

__all__ = ["SqliteRuns"]

_RUN_COLUMNS = ", ".join(RUN_COLUMNS)
_RUN_INSERT = f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({','.join('?' * len(RUN_COLUMNS))})"


class SqliteRuns(SqliteFile):
    def _run_from_row(self, row: Sequence[Any]) -> RunRecord:
        return run_from_row(row, self._where)

    async def create_run(self, run: RunRecord) -> tuple[RunRecord, bool]:
        with self._tx() as db:
            row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run.run_id,)).fetchone()
            if row is not None:
                return self._run_from_row(row), False
            db.execute(_RUN_INSERT, run_values(run))
        return run, True

    def _create_run_in(self, db: sqlite3.Connection, run: RunRecord) -> None:
        """Insert ``run`` inside the caller's transaction; an existing run of its id must be that run."""
        row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run.run_id,)).fetchone()
        if row is None:
            db.execute(_RUN_INSERT, run_values(run))
        else:
            refuse_other_run(self._run_from_row(row), run)

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._query(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run_id,))
        return self._run_from_row(rows[0]) if rows else None

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        params = QmarkParams()
        sql = list_runs_sql("runs", _RUN_COLUMNS, params, status=status, workflow=workflow, limit=limit)
        return [self._run_from_row(r) for r in self._query(sql, params.values)]

    @staticmethod
    def _set_run(db: sqlite3.Connection, run_id: str, changes: dict[str, Any]) -> None:
        """Apply ``changes`` to run ``run_id`` (and its ``updated_at``) inside the caller's transaction."""
        sets = ", ".join(f"{column}=?" for column in set_columns(list(changes)))
        db.execute(f"UPDATE runs SET {sets} WHERE run_id=?", (*set_values(changes, wall_clock()), run_id))

    @staticmethod
    def _check_fence(db: sqlite3.Connection, run_id: str, fence: int, check_cancel: bool) -> None:
        row = db.execute("SELECT fence, cancel_requested FROM runs WHERE run_id=?", (run_id,)).fetchone()
        refuse_unfenced(run_id, fence, row, check_cancel)

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        with self._tx() as db:
            if fence is not None:
                self._check_fence(db, run_id, fence, False)
            self._set_run(db, run_id, changes)

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        # One transaction: a reader sees the whole run or nothing of it, never a run without its journal.
        with self._tx() as db:
            row = db.execute("SELECT fence FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                return False
            if fence is not None and row[0] != fence:
                raise LeaseLost(run_id, fence)
            for table in ("ops", "events", "signals", "runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
        return True
