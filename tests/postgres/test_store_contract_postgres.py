"""The store contract kit (stores/testing.py) against PostgresStore on a real PostgreSQL server (the session's,
tests/postgres/server.py): each test on a schema of its own, a peer with its own pool (another process's
view), and lease expiry by moving the lease's expiry into the past on the server's clock, the one clock
PostgresStore judges leases by; damage written by another connection."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from durable_sandbox.engine.records import Lease
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.postgres import PostgresStore, split_dsn
from durable_sandbox.stores.testing import StoreContractSuite


class TestPostgresStoreContract(StoreContractSuite):
    @pytest.fixture
    async def store(self, postgres_dsn: str) -> AsyncIterator[Store]:
        self.dsn = postgres_dsn
        s = await PostgresStore.connect(postgres_dsn)
        yield s
        await s.close()

    @pytest.fixture
    async def peer(self, store: Store) -> AsyncIterator[Store]:
        s = await PostgresStore.connect(self.dsn)
        yield s
        await s.close()

    async def expire_lease(self, store: Store, lease: Lease) -> None:
        dsn, schema = split_dsn(self.dsn)
        conn = await asyncpg.connect(dsn)
        try:
            status = await conn.execute(
                f"UPDATE {schema}.runs SET lease_expires_at = extract(epoch from clock_timestamp()) - 1 "
                f"WHERE run_id=$1 AND fence=$2", lease.run_id, lease.fence)
        finally:
            await conn.close()
        assert status == "UPDATE 1", f"lease {lease} is not the run's current lease"

    async def damage_run_cells(self, store: Store, run_id: str, cells: dict[str, str]) -> None:
        dsn, schema = split_dsn(self.dsn)
        conn = await asyncpg.connect(dsn)
        try:
            sets = ", ".join(f"{column}=${i}" for i, column in enumerate(cells, start=2))
            status = await conn.execute(f"UPDATE {schema}.runs SET {sets} WHERE run_id=$1", run_id, *cells.values())
        finally:
            await conn.close()
        assert status == "UPDATE 1", f"no run {run_id!r} to damage"
