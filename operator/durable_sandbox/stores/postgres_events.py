"""The PostgreSQL store's event feed: events appended in order (one statement for a batch), read per run after a
seq."""

from __future__ import annotations

from collections.abc import Sequence

from durable_sandbox.engine.records import Event
from durable_sandbox.stores.postgres_connection import PostgresConnection
from durable_sandbox.stores.sql_rows import event_from_row, event_row

__all__ = ["PostgresEvents"]


class PostgresEvents(PostgresConnection):
    async def append_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        columns = [list(column) for column in zip(*(event_row(e) for e in events), strict=True)]
        await self._call("appending events", lambda c: c.execute(
            f"INSERT INTO {self.schema}.events (run_id, type, data, ts) SELECT u.run_id, u.type, u.data, u.ts "
            f"FROM unnest($1::text[], $2::text[], $3::text[], $4::double precision[]) WITH ORDINALITY "
            f"AS u(run_id, type, data, ts, ord) ORDER BY u.ord", *columns), events[0].run_id)

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        rows = await self._call("reading events", lambda c: c.fetch(
            f"SELECT seq, type, data, ts FROM {self.schema}.events WHERE run_id=$1 AND seq>$2 ORDER BY seq "
            f"LIMIT $3", run_id, after, limit), run_id)
        return [event_from_row(run_id, row) for row in rows]
