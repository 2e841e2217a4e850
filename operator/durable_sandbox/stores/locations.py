"""Which store a location names: a ``postgresql://`` URL is a :class:`~durable_sandbox.stores.postgres.PostgresStore`,
anything else the path of a :class:`~durable_sandbox.stores.sqlite.SqliteStore` file. The PostgreSQL store is
imported only when one is named: its driver (asyncpg) is the optional ``postgres`` extra."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from durable_sandbox.engine.errors import StoreError
from durable_sandbox.providers.redaction import redact_url
from durable_sandbox.stores.sqlite import SqliteStore
from durable_sandbox.stores.urls import POSTGRES_SCHEMES, is_postgres_url

__all__ = ["POSTGRES_SCHEMES", "describe", "is_postgres_url", "open_store"]

def describe(location: str | os.PathLike[str]) -> str:
    """The location as it may be shown: a URL without its password (or user), a path as it is."""
    return redact_url(os.fspath(location)) if is_postgres_url(location) else os.fspath(location)


async def open_store(location: str | os.PathLike[str], **options: Any) -> Any:
    """The store at ``location``, open (a PostgreSQL store connected and its schema migrated). ``StoreError``
    says what was wrong, never with a password."""
    if not is_postgres_url(location):
        return SqliteStore(Path(location), **options)
    try:
        from durable_sandbox.stores.postgres import PostgresStore
    except ImportError as exc:
        raise StoreError(
            f"{describe(location)}: a PostgreSQL store needs the asyncpg driver: "
            f"pip install 'durable-sandbox[postgres]' ({exc})"
        ) from None
    return await PostgresStore.connect(os.fspath(location), **options)
