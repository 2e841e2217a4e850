"""The PostgreSQL store's signals: one value per run and callback id, stored once; the same value sent again is a
repeat, another one a conflict (``sql_rules.repeated_signal``)."""

from __future__ import annotations

import time
from typing import Any

from durable_sandbox.stores.postgres_connection import PostgresConnection
from durable_sandbox.stores.sql_rows import dumps, signals_from_rows
from durable_sandbox.stores.sql_rules import repeated_signal

__all__ = ["PostgresSignals"]


class PostgresSignals(PostgresConnection):
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
            return repeated_signal(run_id, callback_id, stored, value)

        return await self._call("storing a signal", run_it, run_id)

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        rows = await self._call("reading signals", lambda c: c.fetch(
            f"SELECT callback_id, value FROM {self.schema}.signals WHERE run_id=$1", run_id), run_id)
        return signals_from_rows(rows)
