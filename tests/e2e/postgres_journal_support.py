"""The operator's PostgreSQL journal as the e2e tests use it: the DSN an operator gets (DSB_OPERATOR_JOURNAL, as
the chart gives it), and reading what the operator wrote into a namespace's schema."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from durable_sandbox.engine.records import OperationRecord, RunRecord
from durable_sandbox.stores.postgres import PostgresStore, split_dsn
from tests.e2e.journal_support import OPERATOR_JOURNAL_ENV, check_rows, drop_namespace_schemas, namespace_dsn
from tests.postgres.server import PostgresServer

ENV = OPERATOR_JOURNAL_ENV


@pytest.fixture
def journal_dsn(postgres_dsn: str, postgres_server: PostgresServer) -> Iterator[str]:
    """The operator's DSN (its base schema this test's own); the schemas of the namespaces it served are dropped
    afterwards."""
    yield postgres_dsn
    drop_namespace_schemas(postgres_server, split_dsn(postgres_dsn)[1])


def pg_run(dsn: str, ns: str, run_id: str) -> tuple[RunRecord | None, list[OperationRecord]]:
    async def read() -> tuple[RunRecord | None, list[OperationRecord]]:
        store = await PostgresStore.connect(namespace_dsn(dsn, ns), pool_size=1)
        try:
            return await store.get_run(run_id), await store.load_journal(run_id)
        finally:
            await store.close()

    return asyncio.run(read())


def check_pg_journal(dsn: str, ns: str, run_id: str) -> None:
    run, rows = pg_run(dsn, ns, run_id)
    assert run is not None, f"run {run_id} is not in PostgreSQL"
    check_rows(rows)
