"""The store contract kit (stores/testing.py) against SqliteStore: one file, a peer instance on the same
file (another process's view), lease expiry through the unit tier's controllable clock, and damage written
to the file by another connection."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_sandbox.engine.records import Lease
from durable_sandbox.engine.store import Store
from durable_sandbox.stores import SqliteStore
from durable_sandbox.stores.testing import StoreContractSuite
from tests.clock import Clock


class TestSqliteStoreContract(StoreContractSuite):
    @pytest.fixture
    async def store(self, tmp_path: Path, clock: Clock) -> AsyncIterator[Store]:
        self.clock = clock
        s = SqliteStore(tmp_path / "contract.db")
        yield s
        await s.close()

    @pytest.fixture
    async def peer(self, store: Store, tmp_path: Path) -> AsyncIterator[Store]:
        s = SqliteStore(tmp_path / "contract.db")
        yield s
        await s.close()

    async def expire_lease(self, store: Store, lease: Lease) -> None:
        self.clock.advance(lease.expires_at - self.clock.time() + 1)

    async def damage_run_cells(self, store: Store, run_id: str, cells: dict[str, str]) -> None:
        assert isinstance(store, SqliteStore)
        with sqlite3.connect(store.path) as db:
            db.execute(f"UPDATE runs SET {', '.join(f'{c}=?' for c in cells)} WHERE run_id=?", (*cells.values(), run_id))
