"""The PostgreSQL store's schema, versioned, and the migrations that bring any older version to the newest.

Every table lives in one PostgreSQL schema of its own (``durable_sandbox`` unless the DSN says
``?schema=...``), so the store can share a database with anything else. ``<schema>.meta`` holds
``schema_version``. ``migrate`` runs in one transaction under an advisory lock: two processes starting at
once against an empty or older database never both migrate, and a failed migration leaves the old version
whole (DDL is transactional in PostgreSQL).

Versions (append only: a released migration never changes):

1. runs, ops (the journal, keyed by run and a per-run seq), signals, cache, threads, events.
2. ``runs.last_token``: the token of the run's newest commit. A commit whose answer was lost (the
   connection dropped, the server restarted) is sent again with the same token; the store then sees that
   it already landed instead of writing its records twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Final

SCHEMA_VERSION = 2
DEFAULT_SCHEMA = "durable_sandbox"
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def check_schema_name(name: str) -> str:
    """``name`` if it is a plain lowercase SQL identifier (it is spliced into statements), else ValueError."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(
            f"schema name {name!r} is not a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 characters)"
        )
    return name


def _v1(s: str) -> list[str]:
    return [
        f"""CREATE TABLE {s}.runs (
            run_id text PRIMARY KEY,
            workflow text NOT NULL,
            status text NOT NULL,
            input text,
            result text,
            error text,
            thread_id text,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            wake_at double precision,
            pending_callbacks text NOT NULL DEFAULT '[]',
            cancel_requested text,
            epoch integer NOT NULL DEFAULT 0,
            lease_owner text,
            lease_expires_at double precision,
            fence bigint NOT NULL DEFAULT 0,
            labels text NOT NULL DEFAULT '{{}}',
            workflow_ref text,
            last_seq bigint NOT NULL DEFAULT 0
        )""",
        f"CREATE INDEX runs_created ON {s}.runs (created_at DESC)",
        # claim_next looks only at runs that are not finished; finished runs pile up, runnable ones do not.
        f"CREATE INDEX runs_runnable ON {s}.runs (updated_at) "
        f"WHERE status IN ('pending', 'running', 'waiting', 'suspended')",
        f"""CREATE TABLE {s}.ops (
            run_id text NOT NULL,
            seq bigint NOT NULL,
            op_id text NOT NULL,
            kind text NOT NULL,
            name text NOT NULL,
            status text NOT NULL,
            attempt integer NOT NULL,
            digest text,
            result text,
            error text,
            meta text,
            ts double precision NOT NULL,
            epoch integer NOT NULL DEFAULT 0,
            PRIMARY KEY (run_id, seq)
        )""",
        f"""CREATE TABLE {s}.signals (
            run_id text NOT NULL,
            callback_id text NOT NULL,
            value text NOT NULL,
            ts double precision NOT NULL,
            PRIMARY KEY (run_id, callback_id)
        )""",
        f"""CREATE TABLE {s}.cache (
            key text PRIMARY KEY,
            value text NOT NULL,
            created_at double precision NOT NULL,
            expires_at double precision
        )""",
        f"""CREATE TABLE {s}.threads (
            thread_id text PRIMARY KEY,
            state text NOT NULL,
            updated_at double precision NOT NULL
        )""",
        f"""CREATE TABLE {s}.events (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id text NOT NULL,
            type text NOT NULL,
            data text NOT NULL,
            ts double precision NOT NULL
        )""",
        f"CREATE INDEX events_run ON {s}.events (run_id, seq)",
    ]


def _v2(s: str) -> list[str]:
    return [f"ALTER TABLE {s}.runs ADD COLUMN last_token bigint"]


MIGRATIONS: Final[Mapping[int, Callable[[str], list[str]]]] = {1: _v1, 2: _v2}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


def lock_key(schema: str) -> int:
    """The advisory lock (a signed 64-bit key) that serializes migrations of ``schema``."""
    value = 0
    for ch in f"durable-sandbox:{schema}".encode():
        value = (value * 131 + ch) % (1 << 63)
    return value


def prelude(schema: str) -> list[str]:
    return [
        f"CREATE SCHEMA IF NOT EXISTS {schema}",
        f"CREATE TABLE IF NOT EXISTS {schema}.meta (key text PRIMARY KEY, value text NOT NULL)",
    ]


def steps(schema: str, current: int, target: int = SCHEMA_VERSION) -> list[str]:
    """The statements that take ``schema`` from version ``current`` to ``target``, in order."""
    out: list[str] = []
    for version in range(current + 1, target + 1):
        out.extend(MIGRATIONS[version](schema))
    return out
