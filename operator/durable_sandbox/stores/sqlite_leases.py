"""The SQLite store's leases: claim a run (moving its fence), renew and release only the current lease, and hand
out the next runnable run. Expiry is judged by this process's wall clock (``sqlite_file.wall_clock``): the
processes sharing a store file share a machine's clock."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.errors import LeaseHeld, LeaseLost, RunNotFound
from durable_sandbox.engine.records import Lease
from durable_sandbox.stores.sql_rules import QmarkParams, runnable_sql
from durable_sandbox.stores.sqlite_file import SqliteFile, wall_clock

__all__ = ["SqliteLeases", "label_sql"]


def label_sql(key: str) -> str:
    """The SQL of a run label's text (labels are a JSON object; a key is a label name, never user SQL)."""
    return f"json_extract(CASE WHEN json_valid(labels) THEN labels END, '$.\"{key}\"')"  # damaged: none


class SqliteLeases(SqliteFile):
    @staticmethod
    def _take(db: sqlite3.Connection, run_id: str, owner: str, ttl: float) -> Lease:
        now = wall_clock()
        db.execute(
            "UPDATE runs SET lease_owner=?, lease_expires_at=?, fence=fence+1 WHERE run_id=?",
            (owner, now + ttl, run_id),
        )
        fence = db.execute("SELECT fence FROM runs WHERE run_id=?", (run_id,)).fetchone()[0]
        return Lease(run_id, owner, fence, now + ttl)

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        with self._tx() as db:
            row = db.execute("SELECT lease_owner, lease_expires_at FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            holder, expires = row
            held = holder is not None and holder != owner and expires is not None and expires > wall_clock()
            if held and (take_over_from is None or holder != take_over_from):
                raise LeaseHeld(run_id, holder, expires)
            return self._take(db, run_id, owner, ttl)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        expires = wall_clock() + ttl
        with self._tx() as db:
            cur = db.execute(
                "UPDATE runs SET lease_expires_at=? WHERE run_id=? AND fence=? AND lease_owner=?",
                (expires, lease.run_id, lease.fence, lease.owner),
            )
            if cur.rowcount != 1:
                raise LeaseLost(lease.run_id, lease.fence)
        return Lease(lease.run_id, lease.owner, lease.fence, expires)

    async def release(self, lease: Lease) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET lease_owner=NULL, lease_expires_at=NULL WHERE run_id=? AND fence=?",
                (lease.run_id, lease.fence),
            )

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None,
                         build: BuildClaims | None = None) -> Lease | None:
        params = QmarkParams()
        condition = runnable_sql(params, wall_clock(), workflows=workflows, build=build, label=label_sql)
        with self._tx() as db:
            row = db.execute(f"SELECT run_id FROM runs WHERE {condition} ORDER BY updated_at LIMIT 1",
                             params.values).fetchone()
            if row is None:
                return None
            return self._take(db, row[0], owner, ttl)
