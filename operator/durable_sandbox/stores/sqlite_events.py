"""The SQLite store's event feed: events appended in order, read per run after a seq."""

from __future__ import annotations

from collections.abc import Sequence

from durable_sandbox.engine.records import Event
from durable_sandbox.stores.sql_rows import event_from_row, event_row
from durable_sandbox.stores.sqlite_file import SqliteFile

__all__ = ["SqliteEvents"]


class SqliteEvents(SqliteFile):
    async def append_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        with self._tx() as db:
            db.executemany("INSERT INTO events (run_id, type, data, ts) VALUES (?,?,?,?)", [event_row(e) for e in events])

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        rows = self._query(
            "SELECT seq, type, data, ts FROM events WHERE run_id=? AND seq>? ORDER BY seq LIMIT ?",
            (run_id, after, limit),
        )
        return [event_from_row(run_id, row) for row in rows]
