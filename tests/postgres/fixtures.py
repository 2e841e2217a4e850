"""pytest fixtures of the PostgreSQL test server (tests/postgres/server.py): one server per session, a
schema of its own per test."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_sandbox.process_identity import process_start
from tests.postgres.server import PostgresServer, PostgresUnavailable, install

FIXTURE = "postgres_server"
PREFIX = "dsb-postgres-"
OWNER_FILE = "owner.json"  # which test session a server directory belongs to


def reap_abandoned(base: Path) -> list[Path]:
    """Stop and delete the servers of test sessions that died without their teardown (SIGKILL, a CI job cut
    off): a session's server otherwise outlives it. A directory's owner is its pytest process (pid and start
    time, so a reused pid is not mistaken for it)."""
    reaped = []
    for directory in base.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            owner = json.loads((directory / OWNER_FILE).read_text())
            if process_start(int(owner["pid"])) == owner["start"]:
                continue  # its session is alive
            with contextlib.suppress(PostgresUnavailable):
                PostgresServer(directory).down()
            shutil.rmtree(directory, ignore_errors=True)
            reaped.append(directory)
    return reaped


def install_if_selected(session: pytest.Session) -> None:
    """Install the server (Debian's packages) before the first test when any selected test needs it, so
    the install never counts against a test's timeout. A failure is reported by the fixture, per test."""
    # The marker too: the e2e tier marks the tests whose operators journal in PostgreSQL (tests/e2e/journal_support.py).
    if any(FIXTURE in getattr(item, "fixturenames", ()) or item.get_closest_marker("postgres")
           for item in session.items):
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
    reap_abandoned(Path(tempfile.gettempdir()))
    directory = Path(tempfile.mkdtemp(prefix=PREFIX))
    (directory / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "start": process_start(os.getpid())}))
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
