"""The PostgreSQL store's connection to its server: the pool (asyncpg, statements prepared once per connection),
the schema created or migrated at connect, and every call through :meth:`PostgresConnection._call`, which waits
for a server that went away (a restart, a failover, the network) up to ``outage_timeout`` seconds with backoff,
then raises ``StoreUnavailable``; a server that refuses for good (a privilege taken away, a full disk, a standby)
is ``StoreRefused`` with what to do. The store's jobs (``postgres_runs.py``, ``postgres_journal.py``, ...) are
built on this class; ``PostgresStore`` (``postgres.py``) puts them together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Self, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from durable_sandbox.engine.errors import StoreError, StoreRefused, StoreUnavailable
from durable_sandbox.providers.redaction import redact_url
from durable_sandbox.stores import postgres_schema as schema_mod
from durable_sandbox.stores.urls import is_postgres_url

__all__ = ["OUTAGE_TIMEOUT", "SERVER_NOW", "PostgresConnection", "split_dsn"]

log = logging.getLogger("durable_sandbox.stores.postgres")

T = TypeVar("T")

OUTAGE_TIMEOUT = 60.0  # how long a call waits for the server to come back before StoreUnavailable
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 1.0
# The server's clock, the one every worker of the store shares: leases are judged by it.
SERVER_NOW = "extract(epoch from clock_timestamp())::double precision"

# SQLSTATEs that mean "the server is away or turning us away for now", not "this request is wrong".
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01"})
# SQLSTATEs (or their classes, two characters) that mean "the server refuses this for good, until someone acts":
# a privilege taken away, the login refused, the disk full, a standby that takes no writes, a value over a
# limit, the schema or database dropped. Raised as StoreRefused: the run stops where it is, nothing recorded,
# and its owner says why (the operator: JournalWriteRefused, retried later), never a crash or the run's failure.
_REFUSED_STATES = frozenset({"42501", "25006", "3D000", "3F000", "42P01"})
_REFUSED_CLASSES = frozenset({"28", "53", "54"})
_REFUSAL_HINTS: Final[Mapping[str, str]] = {
    "42501": "grant the store's role USAGE on its schema and SELECT, INSERT, UPDATE, DELETE on its tables",
    "25006": "the server takes no writes (a standby, or default_transaction_read_only): point the URL at the primary",
    "28": "the server refused the login: check the role and its password ($PGPASSWORD, ~/.pgpass, the Secret)",
    "53": "the server is out of a resource (disk, memory): free it",
    "54": "a value is over one of the server's limits",
    "3D000": "the database is gone: create it, or point the URL at another",
    "3F000": "the store's schema is gone: it is created again only by a new connection; restart the process",
    "42P01": "a table of the store's schema is gone: restore the schema from a backup",
}


def split_dsn(dsn: str) -> tuple[str, str]:
    """(the DSN asyncpg gets, the schema): our own ``schema`` query parameter is taken out of the DSN."""
    parts = urlsplit(dsn)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in pairs if k == "schema"), schema_mod.DEFAULT_SCHEMA)
    rest = urlencode([(k, v) for k, v in pairs if k != "schema"])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), schema


def _is_outage(exc: BaseException, conn: Any = None) -> bool:
    if isinstance(exc, (OSError, asyncpg.PostgresConnectionError)):
        return True
    if isinstance(exc, asyncpg.PostgresError) and getattr(exc, "sqlstate", None) in _OUTAGE_STATES:
        return True
    # "connection was closed in the middle of operation" and friends: whatever it was, it did not finish.
    return isinstance(exc, asyncpg.InterfaceError) and conn is not None and conn.is_closed()


async def _no_reset(conn: Any) -> None:
    """The pool's reset on release (asyncpg's default is a round trip per release: RESET ALL, UNLISTEN, ...).
    This store sets no session state, so there is nothing to reset; asyncpg still rolls back an open
    transaction itself."""


class PostgresConnection:
    """The pool on one server and one schema of it (see the module)."""

    def __init__(self, pool: Any, dsn: str, schema: str, *, outage_timeout: float | None = None) -> None:
        """Use :meth:`connect`."""
        self._pool = pool
        self.dsn = dsn
        self.schema = schema
        self.where = redact_url(dsn)  # names the schema too when it is not the default (?schema=...)
        self.outage_timeout = OUTAGE_TIMEOUT if outage_timeout is None else outage_timeout
        self.outages = 0  # outages met (a call that had to wait for the server), for tests and logs

    def __str__(self) -> str:
        return self.where

    @property
    def pool(self) -> Any:
        """The connection pool, for stores of other schemas on the same server (the operator's namespaces)."""
        return self._pool

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        pool_size: int = 10,
        outage_timeout: float | None = None,
        connect_timeout: float = 10.0,
    ) -> Self:
        """Open a pool on ``dsn`` (``postgresql://user:password@host:port/database[?schema=name]``), create or
        migrate the schema, and return the store. ``StoreError`` says what was wrong (the DSN redacted).
        ``outage_timeout``: how long a call waits for a server that went away (default ``OUTAGE_TIMEOUT``)."""
        if not is_postgres_url(dsn):
            raise StoreError(f"{redact_url(dsn)} is not a PostgreSQL URL (postgresql://user:password@host/db)")
        real_dsn, schema = split_dsn(dsn)
        where = redact_url(dsn)
        try:
            schema_mod.check_schema_name(schema)
        except ValueError as exc:
            raise StoreError(f"PostgreSQL store {where}: {exc}") from None
        try:
            pool = await asyncpg.create_pool(
                real_dsn, min_size=1, max_size=pool_size, reset=_no_reset, timeout=connect_timeout,
                max_inactive_connection_lifetime=60.0, server_settings={"application_name": "durable-sandbox"},
            )
        except Exception as exc:
            raise StoreError(f"Cannot connect to the PostgreSQL store {where}: {_describe(exc)}") from None
        store = cls(pool, dsn, schema, outage_timeout=outage_timeout)
        try:
            await store.migrate()
        except BaseException:
            await pool.close()
            raise
        return store

    async def _call(self, what: str, fn: Callable[[Any], Awaitable[T]], run_id: str | None = None) -> T:
        """Run ``fn(connection)``; while the server is away, wait for it (see the module's docstring)."""
        deadline: float | None = None
        delay = _BACKOFF_FIRST
        while True:
            conn = None
            try:
                async with self._pool.acquire() as conn:
                    return await fn(conn)
            except asyncpg.PostgresError as exc:
                if not _is_outage(exc, conn):
                    refusal = _refusal(exc, f"PostgreSQL store {self.where}: {what}: {_describe(exc)}")
                    if isinstance(refusal, StoreRefused):
                        # A session keeps what it started with (a role's read-only default, its search path):
                        # the next attempt must log in afresh to see the refusal lifted.
                        await self._pool.expire_connections()
                    raise refusal from None
                error: BaseException = exc
            except (OSError, asyncpg.InterfaceError) as exc:
                if not _is_outage(exc, conn):
                    raise
                error = exc
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.outage_timeout
                self.outages += 1
                await self._pool.expire_connections()  # every idle connection is as dead as this one
                log.warning("PostgreSQL store %s unreachable (%s: %s); waiting up to %.0fs for it",
                            self.where, what, _describe(error), self.outage_timeout)
            if now >= deadline:
                raise StoreUnavailable(
                    f"PostgreSQL {self.where} did not answer for {self.outage_timeout:g}s ({what}: "
                    f"{_describe(error)})", run_id
                ) from None
            await asyncio.sleep(min(delay, max(deadline - now, 0.0)))
            delay = min(delay * 2, _BACKOFF_MAX)

    async def migrate(self) -> int:
        """Create the schema or bring it to ``SCHEMA_VERSION``; returns the version found before."""
        s = self.schema

        async def run(conn: Any) -> int:
            # Already current: no DDL at all, so a role that may not create schemas (a namespace's worker role,
            # stores/postgres_grants.py) opens its schema; a role with no right on the schema is refused here.
            if await conn.fetchval("SELECT to_regclass($1)", f"{s}.meta") is not None:
                found = await conn.fetchval(f"SELECT value FROM {s}.meta WHERE key='schema_version'")
                if found is not None and int(found) == schema_mod.SCHEMA_VERSION:
                    return schema_mod.SCHEMA_VERSION
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", schema_mod.lock_key(s))
                for statement in schema_mod.prelude(s):
                    await conn.execute(statement)
                found = await conn.fetchval(f"SELECT value FROM {s}.meta WHERE key='schema_version'")
                current = int(found) if found is not None else 0
                if current > schema_mod.SCHEMA_VERSION:
                    raise StoreError(
                        f"PostgreSQL store {self.where}: its schema is version {current}, newer than this "
                        f"durable-sandbox knows ({schema_mod.SCHEMA_VERSION}); upgrade durable-sandbox"
                    )
                for statement in schema_mod.steps(s, current):
                    await conn.execute(statement)
                if current != schema_mod.SCHEMA_VERSION:
                    await conn.execute(
                        f"INSERT INTO {s}.meta VALUES ('schema_version', $1) ON CONFLICT (key) DO UPDATE "
                        f"SET value = excluded.value", str(schema_mod.SCHEMA_VERSION))
                    log.info("PostgreSQL store %s: schema migrated from version %d to %d", self.where, current,
                             schema_mod.SCHEMA_VERSION)
                return current

        return await self._call("migrating the schema", run)

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._pool.close(), 10)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            self._pool.terminate()


def _refusal(exc: BaseException, message: str) -> StoreError:
    """``exc`` as the store's error: StoreRefused (with what to do) when the server refuses for good."""
    state = str(getattr(exc, "sqlstate", "") or "")
    hint = _REFUSAL_HINTS.get(state) or _REFUSAL_HINTS.get(state[:2])
    if state in _REFUSED_STATES or state[:2] in _REFUSED_CLASSES:
        return StoreRefused(f"{message} (SQLSTATE {state}): {hint}" if hint else f"{message} (SQLSTATE {state})")
    return StoreError(message)


def _describe(exc: BaseException) -> str:
    """An asyncpg or socket error in a line: its text (asyncpg's never carry the password), else its type."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
