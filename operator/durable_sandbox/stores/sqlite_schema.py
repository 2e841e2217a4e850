"""The SQLite store's tables, and bringing a store file made by an older version to this one.

One file holds every table (runs, the journal ``ops``, signals, cache, thread state, events); ``meta`` holds the
schema version. A store written by a newer durable-sandbox is refused rather than misread.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from durable_sandbox.engine.errors import StoreError

__all__ = ["SCHEMA_VERSION", "create_or_migrate"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    status TEXT NOT NULL,
    input TEXT,
    result TEXT,
    error TEXT,
    thread_id TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    wake_at REAL,
    pending_callbacks TEXT NOT NULL DEFAULT '[]',
    cancel_requested TEXT,
    epoch INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_expires_at REAL,
    fence INTEGER NOT NULL DEFAULT 0,
    labels TEXT NOT NULL DEFAULT '{}',
    workflow_ref TEXT
);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status, updated_at);
CREATE TABLE IF NOT EXISTS ops (
    seq INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    op_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    digest TEXT,
    result TEXT,
    error TEXT,
    meta TEXT,
    ts REAL NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ops_run ON ops (run_id, seq);
CREATE TABLE IF NOT EXISTS signals (
    run_id TEXT NOT NULL,
    callback_id TEXT NOT NULL,
    value TEXT NOT NULL,
    ts REAL NOT NULL,
    PRIMARY KEY (run_id, callback_id)
);
CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL);
CREATE TABLE IF NOT EXISTS threads (thread_id TEXT PRIMARY KEY, state TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    ts REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, seq);
"""


def create_or_migrate(db: sqlite3.Connection, path: Path) -> None:
    """Create the tables of a new store, or bring an older one's up to date (``path`` names it in errors)."""
    db.executescript(_SCHEMA)
    columns = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    if "workflow_ref" not in columns:  # stores made before the column existed
        db.execute("ALTER TABLE runs ADD COLUMN workflow_ref TEXT")
    row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    if row is None:
        db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
    elif int(row[0]) > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer durable-sandbox (schema {row[0]} > {SCHEMA_VERSION}); upgrade."
        )
