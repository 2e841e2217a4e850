"""The PostgreSQL store's leases: claim a run (moving its fence), renew and release only the current lease, and
hand out the next runnable run. Expiry is judged by the *server's* clock (``SERVER_NOW``), the one clock every
worker of the store shares; ``claim_next`` picks with ``FOR UPDATE SKIP LOCKED``: two workers never hand out the
same run, and neither waits for the other."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.errors import LeaseHeld, LeaseLost, RunNotFound
from durable_sandbox.engine.records import Lease
from durable_sandbox.stores.postgres_connection import SERVER_NOW, PostgresConnection
from durable_sandbox.stores.sql_rows import loads
from durable_sandbox.stores.sql_rules import NumberedParams, runnable_sql

__all__ = ["PostgresLeases"]

_CLAIM_TRIES = 3


def _label(key: str) -> str:
    """The SQL of a run label's text (labels are JSON text; a key is a label name, never user SQL)."""
    return f"(labels::jsonb ->> '{key}')"


def _labels(text: str | None) -> dict[str, Any]:
    """A labels cell as every read of the store reads it: a damaged one (not a JSON object) as no labels."""
    try:
        value = loads(text) if text is not None else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class PostgresLeases(PostgresConnection):
    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        s = self.schema
        sql = (
            f"UPDATE {s}.runs SET lease_owner=$2, lease_expires_at={SERVER_NOW} + $3, fence=fence+1 "
            f"WHERE run_id=$1 AND (lease_owner IS NULL OR lease_owner=$2 OR lease_expires_at IS NULL "
            f"OR lease_expires_at <= {SERVER_NOW} OR lease_owner=$4) RETURNING fence, lease_expires_at"
        )

        async def run_it(conn: Any) -> Lease:
            # The holder may release (or its lease lapse) between the UPDATE that found it held and the SELECT
            # that reads who holds it: then the run is free, and the claim is tried again rather than reported
            # as held by nobody. Bounded: a run that keeps changing hands is reported held by its last holder.
            held = None
            for _ in range(_CLAIM_TRIES):
                row = await conn.fetchrow(sql, run_id, owner, float(ttl), take_over_from)
                if row is not None:
                    return Lease(run_id, owner, row["fence"], row["lease_expires_at"])
                held = await conn.fetchrow(
                    f"SELECT lease_owner, lease_expires_at, lease_expires_at > {SERVER_NOW} AS live "
                    f"FROM {s}.runs WHERE run_id=$1", run_id)
                if held is None:
                    raise RunNotFound(run_id)
                if held["lease_owner"] is not None and held["live"]:
                    break
            assert held is not None
            raise LeaseHeld(run_id, held["lease_owner"] or "?", held["lease_expires_at"] or time.time())

        return await self._call("claiming a run", run_it, run_id)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        expires = await self._call("renewing a lease", lambda c: c.fetchval(
            f"UPDATE {self.schema}.runs SET lease_expires_at={SERVER_NOW} + $4 WHERE run_id=$1 AND fence=$2 "
            f"AND lease_owner=$3 RETURNING lease_expires_at", lease.run_id, lease.fence, lease.owner, float(ttl)),
            lease.run_id)
        if expires is None:
            raise LeaseLost(lease.run_id, lease.fence)
        return Lease(lease.run_id, lease.owner, lease.fence, expires)

    async def release(self, lease: Lease) -> None:
        await self._call("releasing a lease", lambda c: c.execute(
            f"UPDATE {self.schema}.runs SET lease_owner=NULL, lease_expires_at=NULL WHERE run_id=$1 AND fence=$2",
            lease.run_id, lease.fence), lease.run_id)

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None,
                         build: BuildClaims | None = None) -> Lease | None:
        s = self.schema
        params = NumberedParams(taken=2)  # $1 owner, $2 ttl
        condition = runnable_sql(params, time.time(), lease_clock=SERVER_NOW, workflows=workflows, build=build,
                                 label=_label)
        # The first condition is runs_runnable's (a partial index of the runs not finished).
        sql = (
            f"WITH c AS (SELECT run_id FROM {s}.runs WHERE status IN ('pending', 'running', 'waiting', 'suspended') "
            f"AND {condition} ORDER BY updated_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
            f"UPDATE {s}.runs r SET lease_owner=$1, lease_expires_at={SERVER_NOW} + $2, fence=r.fence+1 FROM c "
            f"WHERE r.run_id = c.run_id RETURNING r.run_id, r.fence, r.lease_expires_at"
        )
        args = [owner, float(ttl), *params.values]

        async def claim(conn: Any) -> Any:
            try:
                return await conn.fetchrow(sql, *args)
            except asyncpg.InvalidTextRepresentationError:  # a damaged labels cell: one bad row never fails a claim
                assert build is not None
                return await self._claim_reading_labels(conn, owner, ttl, workflows, build)

        row = await self._call("claiming the next runnable run", claim)
        return Lease(row["run_id"], owner, row["fence"], row["lease_expires_at"]) if row is not None else None

    async def _claim_reading_labels(self, conn: Any, owner: str, ttl: float, workflows: Sequence[str] | None,
                                    build: BuildClaims) -> Any:
        """``claim_next`` for ``build`` when a runnable run's labels cell is not JSON (the server cannot read it):
        the runnable runs' labels read as every read of the store reads them (a damaged cell as none), and
        ``BuildClaims.admits`` deciding, the candidates locked as the query locks its one."""
        s = self.schema
        params = NumberedParams()
        condition = runnable_sql(params, time.time(), lease_clock=SERVER_NOW, workflows=workflows)
        async with conn.transaction():
            rows = await conn.fetch(
                f"SELECT run_id, workflow, labels FROM {s}.runs WHERE status IN ('pending', 'running', 'waiting', "
                f"'suspended') AND {condition} ORDER BY updated_at FOR UPDATE SKIP LOCKED", *params.values)
            for row in rows:
                if build.admits_labels(row["workflow"], _labels(row["labels"])):
                    return await conn.fetchrow(
                        f"UPDATE {s}.runs SET lease_owner=$1, lease_expires_at={SERVER_NOW} + $2, fence=fence+1 "
                        f"WHERE run_id=$3 RETURNING run_id, fence, lease_expires_at", owner, float(ttl), row["run_id"])
        return None
