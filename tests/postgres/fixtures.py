"""pytest fixtures of the PostgreSQL test server (tests/postgres/server.py): one server per session, a
schema of its own per test."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres.server import PostgresServer, PostgresUnavailable, install

FIXTURE = "postgres_server"


def install_if_selected(session: pytest.Session) -> None:
    """Install the server (Debian's packages) before the first test when any selected test needs it, so
    the install never counts against a test's timeout. A failure is reported by the fixture, per test."""
    if any(FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        try:
            install()
        except PostgresUnavailable:
            pass  # the fixture raises it again, with the reason, for every test that needs the server


def mark_postgres_tests(items: list[pytest.Item]) -> None:
    for item in items:
        if FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this session's own on 127.0.0.1 (a free port), stopped and deleted at the end.
    Outside pytest's tmp dir on purpose: the server user must be able to enter its directory."""
    directory = Path(tempfile.mkdtemp(prefix="dsb-postgres-"))
    server = PostgresServer(directory)
    try:
        server.up()
    except PostgresUnavailable as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"the PostgreSQL test server cannot start: {exc}") from None
    try:
        yield server
    finally:
        server.down(purge=True)


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A DSN (with the password) whose ``schema`` is this test's own; the schema is dropped afterwards."""
    if not postgres_server.running():  # a test that stopped the server and failed before starting it again
        postgres_server.start()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{postgres_server.dsn()}?schema={schema}"
    if not postgres_server.running():
        postgres_server.start()
    postgres_server.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
