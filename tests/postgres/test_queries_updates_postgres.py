"""Queries and updates on PostgreSQL (the cases: tests/unit/query_update_cases.py), each test on a schema of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from durable_sandbox.engine.store import Store
from durable_sandbox.stores.postgres import PostgresStore
from tests.unit.query_update_cases import QueryUpdateCases


class TestQueriesUpdatesPostgres(QueryUpdateCases):
    @pytest.fixture
    async def store(self, postgres_dsn: str) -> AsyncIterator[Store]:
        self.location = postgres_dsn
        s = await PostgresStore.connect(postgres_dsn)
        yield s
        await s.close()
