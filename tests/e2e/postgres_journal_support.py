"""The operator's PostgreSQL journal as the e2e tests use it: the DSN an operator gets (DSB_OPERATOR_JOURNAL, as
the chart gives it), and reading what the operator wrote into a namespace's schema."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from durable_sandbox.engine.records import OperationRecord, RunRecord
from durable_sandbox.kube.journals import namespace_schema
from durable_sandbox.stores.postgres import PostgresStore, split_dsn
from tests.postgres.server import PostgresServer

ENV = "DSB_OPERATOR_JOURNAL"


@pytest.fixture
def journal_dsn(postgres_dsn: str, postgres_server: PostgresServer, namespace: str) -> Iterator[str]:
    """The operator's DSN (its base schema this test's own); the namespace's schema is dropped afterwards."""
    yield postgres_dsn
    if not postgres_server.running():
        postgres_server.start()
    postgres_server.sql(f"DROP SCHEMA IF EXISTS {namespace_schema(split_dsn(postgres_dsn)[1], namespace)} CASCADE")


def _store_dsn(dsn: str, ns: str) -> str:
    """A DSN naming ``ns``'s schema, to read what the operator wrote there."""
    real, base = split_dsn(dsn)
    return f"{real}?schema={namespace_schema(base, ns)}"


def pg_run(dsn: str, ns: str, run_id: str) -> tuple[RunRecord | None, list[OperationRecord]]:
    async def read() -> tuple[RunRecord | None, list[OperationRecord]]:
        store = await PostgresStore.connect(_store_dsn(dsn, ns), pool_size=1)
        try:
            return await store.get_run(run_id), await store.load_journal(run_id)
        finally:
            await store.close()

    return asyncio.run(read())


def check_pg_journal(dsn: str, ns: str, run_id: str) -> None:
    run, rows = pg_run(dsn, ns, run_id)
    assert run is not None, f"run {run_id} is not in PostgreSQL"
    assert [r.seq for r in rows] == list(range(1, len(rows) + 1)), "journal has gaps or duplicates"
    completed = [r.op_id for r in rows if r.status == "completed"]
    assert len(completed) == len(set(completed)), "an operation completed twice"
