"""Whether a store location is a PostgreSQL URL: its own module, below both the PostgreSQL store and the
module that opens a store by its location (``stores/locations.py``), so neither imports the other back."""

from __future__ import annotations

import os

__all__ = ["POSTGRES_SCHEMES", "is_postgres_url"]

POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(location: str | os.PathLike[str]) -> bool:
    text = os.fspath(location)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in POSTGRES_SCHEMES
