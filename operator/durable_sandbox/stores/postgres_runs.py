"""The PostgreSQL store's runs: create (idempotent, never over a journal left without its run), read, list,
change (fenced when asked) and delete with everything the run wrote, each one statement."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged, LeaseLost, StoreError
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.stores.postgres_connection import PostgresConnection
from durable_sandbox.stores.sql_rows import RUN_COLUMNS, run_from_row, run_values
from durable_sandbox.stores.sql_rules import (
    NumberedParams,
    list_runs_sql,
    refuse_other_run,
    set_columns,
    set_values,
)

__all__ = ["PostgresRuns"]

_RUN_SELECT = ", ".join(RUN_COLUMNS)


class PostgresRuns(PostgresConnection):
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

    async def _create_run_on(self, conn: Any, run: RunRecord) -> None:
        """Insert ``run`` on ``conn`` (in the caller's transaction); an existing run of its id must be that run."""
        values = run_values(run)
        params = ", ".join(f"${i}" for i in range(1, len(values) + 1))
        if not await conn.fetchval(f"INSERT INTO {self.schema}.runs ({_RUN_SELECT}) VALUES ({params}) "
                                   f"ON CONFLICT (run_id) DO NOTHING RETURNING true", *values):
            row = await conn.fetchrow(f"SELECT {_RUN_SELECT} FROM {self.schema}.runs WHERE run_id=$1", run.run_id)
            if row is not None:
                refuse_other_run(self._run_from_row(row), run)

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._call("reading a run", lambda c: c.fetchrow(
            f"SELECT {_RUN_SELECT} FROM {self.schema}.runs WHERE run_id=$1", run_id), run_id)
        return self._run_from_row(row) if row is not None else None

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        params = NumberedParams()
        sql = list_runs_sql(f"{self.schema}.runs", _RUN_SELECT, params, status=status, workflow=workflow, limit=limit)
        rows = await self._call("listing runs", lambda c: c.fetch(sql, *params.values))
        return [self._run_from_row(r) for r in rows]

    @staticmethod
    def _set_clauses(keys: Sequence[str], first: int) -> list[str]:
        """SET clauses for run fields ``keys`` then ``updated_at``, parameters numbered from ``$first``."""
        return [f"{column}=${first + i}" for i, column in enumerate(set_columns(keys))]

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        sets, values = self._set_clauses(list(changes), 2), set_values(changes, time.time())
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
