"""The SQLite store's signals: one value per run and callback id, stored once; the same value sent again is a
repeat, another one a conflict (``sql_rules.repeated_signal``)."""

from __future__ import annotations

from typing import Any

from durable_sandbox.stores.sql_rows import dumps, signals_from_rows
from durable_sandbox.stores.sql_rules import repeated_signal
from durable_sandbox.stores.sqlite_file import SqliteFile, wall_clock

__all__ = ["SqliteSignals"]


class SqliteSignals(SqliteFile):
    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        with self._tx() as db:
            row = db.execute(
                "SELECT value FROM signals WHERE run_id=? AND callback_id=?", (run_id, callback_id)
            ).fetchone()
            if row is not None:
                return repeated_signal(run_id, callback_id, row[0], value)
            db.execute("INSERT INTO signals VALUES (?,?,?,?)", (run_id, callback_id, dumps(value), wall_clock()))
        return True

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        return signals_from_rows(self._query("SELECT callback_id, value FROM signals WHERE run_id=?", (run_id,)))
