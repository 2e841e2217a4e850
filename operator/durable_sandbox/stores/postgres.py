"""``PostgresStore``: the engine's store in PostgreSQL, for workers on many machines and journals that
outgrow one file or the API server. ``await PostgresStore.connect("postgresql://user:pw@host/db")``.

On asyncpg (docs/architecture.md says why): a pool of connections, statements prepared once per
connection. Every write is one statement, so one round trip and its own transaction:

- **commit** is ``UPDATE runs ... WHERE fence = mine [AND no cancel request] RETURNING last_seq`` with the
  journal rows, thread state and cache entry inserted by data-modifying CTEs that select from that
  UPDATE: they land with it or not at all. The UPDATE takes the run row's lock, so a commit and a claim
  (which moves the fence) are serialized: a stale holder's commit either lands before the claim (and the
  new holder reads it) or finds the new fence and writes nothing. The records' seqs are the run's
  ``last_seq`` + 1, + 2, ...: per run, dense, in commit order.
- **claim/renew/release/claim_next** compare lease expiry with the *server's* clock, the one clock every
  worker of the store shares. ``claim_next`` picks with ``FOR UPDATE SKIP LOCKED``: two workers never
  hand out the same run, and neither waits for the other.

**When the server is away** (a restart, a failover, the network): every call retries with backoff for up
to ``outage_timeout`` seconds (the runs pause at their next commit, which is the next call boundary), then
raises ``StoreUnavailable``, which the engine handles as a lost lease: the worker stops executing the run
without writing, and the run resumes from its journal when claimed again. A commit whose answer was lost
is sent again with the same token (``runs.last_token``): if the first one landed, the second writes
nothing and the store returns the first one's seqs, so no record is lost or written twice.

Carved by job, one module each, put together here: the connection, its waiting and its errors
(``postgres_connection.py``, the schema in ``postgres_schema.py``), runs (``postgres_runs.py``), the journal and
what commits write beside it (``postgres_journal.py``), leases (``postgres_leases.py``), signals
(``postgres_signals.py``) and the event feed (``postgres_events.py``). The row codec (``sql_rows.py``) and what both
SQL stores decide the same way (``sql_rules.py``) are shared with the SQLite store.
"""

from __future__ import annotations

from durable_sandbox.stores.postgres_connection import split_dsn
from durable_sandbox.stores.postgres_events import PostgresEvents
from durable_sandbox.stores.postgres_journal import PostgresJournal
from durable_sandbox.stores.postgres_leases import PostgresLeases
from durable_sandbox.stores.postgres_signals import PostgresSignals

__all__ = ["PostgresStore", "split_dsn"]


class PostgresStore(PostgresJournal, PostgresLeases, PostgresSignals, PostgresEvents):
    """The engine's store in PostgreSQL (see the module). ``await PostgresStore.connect(dsn)``."""
