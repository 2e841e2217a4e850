"""``SqliteStore``: the embedded default store. No server; several local processes may share one file.

Why plain ``sqlite3`` on the event loop rather than a thread pool: a WAL commit without fsync costs
about 15 µs, far less than a hop to a worker thread and back, and the step path commits twice per step.
With ``durability="fsync"`` each commit waits for the disk (power-loss safe) and blocks the loop for
that long; that is the price of the guarantee.

Durability modes:
- ``"process"`` (default): WAL with ``synchronous=NORMAL``: a committed record survives the death of
  any process (SIGKILL included); a power cut may lose the last few commits.
- ``"fsync"``: ``synchronous=FULL``: every commit is on disk before it returns.

Carved by job, one module each, put together here: the file and its connection (``sqlite_file.py``, the tables in
``sqlite_schema.py``), runs (``sqlite_runs.py``), the journal and what commits write beside it
(``sqlite_journal.py``), leases (``sqlite_leases.py``), signals (``sqlite_signals.py``) and the event feed
(``sqlite_events.py``). The row codec (``sql_rows.py``) and what both SQL stores decide the same way
(``sql_rules.py``) are shared with the PostgreSQL store.
"""

from __future__ import annotations

from durable_sandbox.stores.sqlite_events import SqliteEvents
from durable_sandbox.stores.sqlite_file import Durability, default_home
from durable_sandbox.stores.sqlite_journal import SqliteJournal
from durable_sandbox.stores.sqlite_leases import SqliteLeases
from durable_sandbox.stores.sqlite_signals import SqliteSignals

__all__ = ["Durability", "SqliteStore", "default_home"]


class SqliteStore(SqliteJournal, SqliteLeases, SqliteSignals, SqliteEvents):
    """The engine's store in one SQLite file (see the module). ``SqliteStore(path, durability="process")``."""

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r}, durability={self.durability!r})"
