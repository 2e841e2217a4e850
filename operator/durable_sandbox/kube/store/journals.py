"""Where the operator keeps its runs' journals: the choice `dsb operator --journal` made, and the per-namespace
store each choice gives the engine of that namespace.

* :class:`ApiServerJournal` (the default): each namespace's runs in its own Journal objects, sealed with the
  journal key (``KubernetesStore``), owned by their Workflow (deleting it collects them).
* :class:`PostgresJournal`: the journal, events, signals, cache and thread state in PostgreSQL, one schema per
  namespace (``<base schema>_ns_<namespace>``), all on one connection pool. A run's identity is its schema
  and its id: nothing in one namespace can name, read or end a run of another. PostgreSQL is out of every
  namespace user's reach (no object of theirs says what is in it), so nothing is sealed there; the
  Workflow's status stays the bounded projection it is with the API-server journal. The DSN carries a
  password: it is never printed (``repr`` and logs show it redacted).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.store import KubernetesStore, OwnerRef, run_key
from durable_sandbox.kube.store.finished import FinishedRuns, finished_keys
from durable_sandbox.providers.redaction import redact_url
from durable_sandbox.stores.postgres import PostgresStore, split_dsn
from durable_sandbox.stores.postgres_schema import check_schema_name

__all__ = ["ApiServerJournal", "JournalChoice", "JournalStores", "NamespaceSchemaStore", "PostgresJournal",
           "namespace_schema", "open_journal", "probe"]

_MAX_IDENTIFIER = 63
FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
FINISHED_LIMIT = 1_000_000  # the sweep's view of one namespace's finished runs (kept until their Workflow goes)


@dataclass(frozen=True)
class ApiServerJournal:
    """The journal in the API server (Journal objects), the default."""

    def __str__(self) -> str:
        return "the API server"


@dataclass(frozen=True)
class PostgresJournal:
    """The journal in PostgreSQL at ``dsn`` (``postgresql://user:password@host/db[?schema=base]``)."""

    dsn: str = field(repr=False)
    pool_size: int = 10

    def __str__(self) -> str:
        return f"PostgreSQL {redact_url(self.dsn)}"

    def __repr__(self) -> str:
        return f"PostgresJournal({self})"


JournalChoice = ApiServerJournal | PostgresJournal


def namespace_schema(base: str, namespace: str) -> str:
    """The schema of ``namespace``'s runs: ``<base>_ns_<namespace>`` with ``-`` as ``_`` (injective: a namespace
    name has no ``_``), or, when that is longer than an identifier may be, ``<base>_nh_<digest of namespace>``."""
    readable = f"{base}_ns_{namespace.replace('-', '_')}"
    if len(readable) <= _MAX_IDENTIFIER:
        return check_schema_name(readable)
    digest = hashlib.sha256(namespace.encode()).hexdigest()
    return check_schema_name(f"{base}_nh_{digest}"[:_MAX_IDENTIFIER])


class NamespaceSchemaStore(PostgresStore):
    """One namespace's runs in its own schema on the operator's shared pool. Its schema is created (or
    migrated) on its first use, so that a namespace the operator has not served yet costs nothing."""

    def __init__(self, pool: Any, dsn: str, schema: str, *, outage_timeout: float | None = None) -> None:
        super().__init__(pool, dsn, schema, outage_timeout=outage_timeout)
        self.where = f"{redact_url(dsn)} (schema {schema})"
        self._ready = False
        self._lock = asyncio.Lock()
        self._migrator: asyncio.Task[Any] | None = None

    async def _call(self, what: str, fn: Any, run_id: str | None = None) -> Any:
        if not self._ready and asyncio.current_task() is not self._migrator:
            async with self._lock:
                if not self._ready:
                    self._migrator = asyncio.current_task()
                    try:
                        await self.migrate()
                    finally:
                        self._migrator = None
                    self._ready = True
        return await super()._call(what, fn, run_id)

    async def create_run(self, run: RunRecord, *, owner: OwnerRef | None = None) -> tuple[RunRecord, bool]:
        """``owner`` is the API-server journal's (its objects are collected with their Workflow); here the
        Workflow's cleanup deletes the run (:attr:`JournalStores.collected_with_workflow` is False)."""
        return await super().create_run(run)

    async def close(self) -> None:
        """The pool is the operator's, closed once by :meth:`JournalStores.aclose`."""


class JournalStores:
    """The store of each namespace for one journal choice."""

    def __init__(self, choice: JournalChoice, api: KubeClient, *, journal_key: bytes | None = None,
                 pool: Any = None) -> None:
        self.choice = choice
        self._api = api
        self._journal_key = journal_key
        self._pool = pool  # the PostgreSQL pool (open_journal opens it), None for the API server
        self._base_schema = split_dsn(choice.dsn)[1] if isinstance(choice, PostgresJournal) else ""
        self._schemas: dict[str, NamespaceSchemaStore] = {}  # one per namespace: its schema is checked once

    @property
    def journal_key(self) -> bytes | None:
        """The key that seals what the operator writes (kube/journal/sealing.py), None without one."""
        return self._journal_key

    @property
    def collected_with_workflow(self) -> bool:
        """Whether deleting a Workflow deletes its run's journal by itself (owner references), or the cleanup
        must delete it."""
        return isinstance(self.choice, ApiServerJournal)

    def store_for(self, namespace: str) -> Any:
        if isinstance(self.choice, PostgresJournal):
            store = self._schemas.get(namespace)
            if store is None:
                store = self._schemas[namespace] = NamespaceSchemaStore(
                    self._pool, self.choice.dsn, namespace_schema(self._base_schema, namespace))
            return store
        return KubernetesStore(namespace, self._api, journal_key=self._journal_key)

    def location(self, namespace: str, run_id: str) -> str:
        """Where ``run_id``'s journal is, as a message to a cluster administrator names it."""
        if isinstance(self.choice, PostgresJournal):
            return f"PostgreSQL {self.store_for(namespace).where}"
        return f"Journal {namespace}/dsb.{run_key(run_id)}"

    async def finished_runs(self, namespace: str) -> FinishedRuns:
        """``namespace``'s finished runs for the orphan sweep, by their journal records (sealed in the API server:
        ``finished.py``; in PostgreSQL, the namespace's own schema). A run that continued as new is not finished
        (its chain goes on); the end of a chain marks its first run (the Workflow's) finished too."""
        if not isinstance(self.choice, PostgresJournal):
            store = self.store_for(namespace)
            assert isinstance(store, KubernetesStore)
            return await store.finished_runs()
        runs = await self.store_for(namespace).list_runs(status=FINISHED, limit=FINISHED_LIMIT)
        return FinishedRuns(finished_keys(runs, {r.run_id for r in runs}))

    async def aclose(self) -> None:
        if self._pool is not None:
            await PostgresStore(self._pool, "", self._base_schema).close()
            self._pool = None


async def open_journal(choice: JournalChoice, api: KubeClient, *, journal_key: bytes | None = None) -> JournalStores:
    """The stores of ``choice``; for PostgreSQL the pool is opened (and the base schema checked) here, so that a
    wrong DSN or a server out of reach stops the operator at start with a ``StoreError`` that says so."""
    if isinstance(choice, ApiServerJournal):
        return JournalStores(choice, api, journal_key=journal_key)
    probe = await PostgresStore.connect(choice.dsn, pool_size=choice.pool_size)
    return JournalStores(choice, api, journal_key=journal_key, pool=probe.pool)


async def probe(choice: PostgresJournal) -> None:
    """Connect to ``choice``'s server once and let go (``StoreError`` says why not)."""
    store = await PostgresStore.connect(choice.dsn, pool_size=1)
    await store.close()
