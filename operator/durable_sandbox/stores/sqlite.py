"""``SqliteStore``: the embedded default store. No server; several local processes may share one file.

Why plain ``sqlite3`` on the event loop rather than a thread pool: a WAL commit without fsync costs
about 15 µs, far less than a hop to a worker thread and back, and the step path commits twice per step.
With ``durability="fsync"`` each commit waits for the disk (power-loss safe) and blocks the loop for
that long; that is the price of the guarantee.

Durability modes:
- ``"process"`` (default): WAL with ``synchronous=NORMAL``: a committed record survives the death of
  any process (SIGKILL included); a power cut may lose the last few commits.
- ``"fsync"``: ``synchronous=FULL``: every commit is on disk before it returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from durable_sandbox.engine.errors import LeaseHeld, LeaseLost, RunCancelledError, SignalConflict, StoreError
from durable_sandbox.engine.records import (
    Commit,
    Event,
    Lease,
    OperationRecord,
    RunRecord,
    RunStatus,
)
from durable_sandbox.stores.sql_rows import (
    OP_COLUMNS,
    RUN_COLUMNS,
    canonical,
    change_value,
    dumps,
    op_cells,
    op_from_row,
    run_from_row,
    run_values,
)

Durability = Literal["process", "fsync"]

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

_RUN_COLUMNS = ", ".join(RUN_COLUMNS)
_OP_COLUMNS = ", ".join(OP_COLUMNS)
_OP_INSERT = (
    "INSERT INTO ops (run_id, op_id, kind, name, status, attempt, digest, result, error, meta, ts, epoch) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
# The step path's commits, of one record or a few (a step's start with its outcome, a call's completion with
# the next call's start) and nothing else: one fenced statement, its own transaction (autocommit). The
# fence (and cancellation) is checked by the same statement that writes, so a stale worker can never slip a
# row in; the rows go in in VALUES order, with consecutive seqs (one statement holds the write lock).
_OP_FENCED_MAX = 4


def _op_fenced(n: int, check_cancel: bool) -> str:
    rows = ",".join(["(?,?,?,?,?,?,?,?,?,?,?,?)"] * n)
    return (
        "INSERT INTO ops (run_id, op_id, kind, name, status, attempt, digest, result, error, meta, ts, epoch) "
        f"SELECT * FROM (VALUES {rows}) WHERE EXISTS (SELECT 1 FROM runs WHERE run_id=? AND fence=?"
        + (" AND cancel_requested IS NULL)" if check_cancel else ")")
    )


_OP_FENCED = {(n, check): _op_fenced(n, check) for n in range(1, _OP_FENCED_MAX + 1) for check in (False, True)}


def default_home() -> Path:
    return Path(os.environ.get("DURABLE_SANDBOX_HOME") or Path.home() / ".local" / "state" / "durable-sandbox")


_SQLITE_HEADER = b"SQLite format 3\0"
# The step path's single-row commits check the store file's identity every this many commits (a stat
# each would cost a tenth of a no-op step); every transaction (run status, leases, the end of a run)
# checks it always, so a run never finishes on a deleted store without saying so.
_IDENTITY_CHECK_EVERY = 64


def _path_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a store, judged before SQLite touches it (SQLite would create
    ``/dev/null-journal`` next to a device, or report a bare "file is not a database")."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None  # a new store
    except OSError as e:
        return f"it cannot be examined ({e.strerror or e})"
    if stat.S_ISDIR(info.st_mode):
        return f"it is a directory; give a store file's path, e.g. {path / 'runs.db'}"
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file (a device, FIFO or socket); give the path of a store file"
    if info.st_size:
        try:
            with path.open("rb") as f:
                header = f.read(len(_SQLITE_HEADER))
        except OSError as e:
            return f"it cannot be read ({e.strerror or e})"
        if header != _SQLITE_HEADER:
            return "it is not a SQLite database (it lacks SQLite's header); give a store's path, or a new file name"
    return None


def _read_only(path: Path) -> bool:
    directory = path.parent if path.parent.exists() else None
    if directory is None:
        return False
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return True
    except OSError:
        return False
    return not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK))


def _explain(error: sqlite3.Error) -> str:
    text = str(error)
    if "readonly" in text or "read-only" in text:
        return (f"it is read-only ({text}); make the file and its directory writable (SQLite also writes "
                f"the -wal and -shm files beside it)")
    if "disk is full" in text or "database or disk is full" in text:
        return f"the disk is full ({text}); free space, then resume the run (`dsb resume RUN`): nothing committed is lost"
    if "unable to open" in text:
        return f"SQLite cannot open it ({text}); check that its directory exists and is writable"
    if "not a database" in text or "malformed" in text:
        return f"it is damaged or not a store ({text}); restore it from a backup (docs/reliability.md)"
    return text


def _owner_only(path: Path) -> None:
    """Create the store file readable by its owner only (workflow inputs, results and tool output are in
    it), and tighten one made before this rule. SQLite creates the -wal and -shm files with the
    database file's mode, so they follow."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077 and os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        with contextlib.suppress(OSError):
            if extra.stat().st_mode & 0o077 and extra.stat().st_uid == os.geteuid():
                extra.chmod(0o600)


class SqliteStore:
    def __init__(self, path: str | os.PathLike[str] | None = None, *, durability: Durability = "process") -> None:
        if durability not in ("process", "fsync"):
            raise ValueError(f"durability must be 'process' or 'fsync', not {durability!r}")
        self.path = Path(path) if path is not None else default_home() / "runs.db"
        self.durability = durability
        problem = _path_problem(self.path)
        if problem is not None:
            raise StoreError(f"Cannot use {self.path} as a store: {problem}")
        if _read_only(self.path):
            raise StoreError(
                f"Cannot open the store {self.path}: it is read-only; make the file and its directory writable "
                f"(SQLite writes the -wal and -shm files beside it, even to read)"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"Cannot create the store's directory {self.path.parent}: {e.strerror or e}") from None
        try:
            _owner_only(self.path)
        except OSError as e:
            raise StoreError(f"Cannot open the store {self.path}: {e.strerror or e}") from None
        try:
            self._open()
        except sqlite3.Error as e:
            raise StoreError(f"Cannot open the store {self.path}: {_explain(e)}") from None
        # Which file this process writes to: if the path stops naming it (the file or its directory
        # deleted or replaced), every later write would go to a file nobody will ever read again.
        self._path_text = str(self.path)
        self._identity = self._file_identity()
        self._unchecked = 0

    def _file_identity(self) -> tuple[int, int]:
        info = os.stat(self._path_text)
        return info.st_dev, info.st_ino

    def _check_file(self) -> None:
        try:
            same = self._file_identity() == self._identity
        except FileNotFoundError:
            same = False
        if not same:
            raise StoreError(
                f"The store file {self.path} was deleted or replaced while this process was using it; "
                f"what this process writes now could never be read again, so it stops here. Restore the "
                f"store from a backup (docs/reliability.md) or start the runs again."
            )

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's errors, said with the store's path and what to do."""
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(f"Store {self.path}: {_explain(e)}") from None

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._errors():
            return self._db.execute(sql, args).fetchall()

    def _open(self) -> None:
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if self.durability == 'fsync' else 'NORMAL'}")
        self._db.execute("PRAGMA busy_timeout=30000")
        # Checkpointing the WAL back into the database file fsyncs; at SQLite's default (every 1,000
        # pages) that fsync is a large share of a small commit. 4,096 pages amortises it over a few
        # hundred steps; journal_size_limit then truncates the WAL after each checkpoint, so the files
        # on disk stay within ~16 MiB of the data. Neither changes what a commit guarantees.
        self._db.execute("PRAGMA wal_autocheckpoint=4096")
        self._db.execute(f"PRAGMA journal_size_limit={16 * 1024 * 1024}")
        self._db.executescript(_SCHEMA)
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(runs)")}
        if "workflow_ref" not in columns:  # stores made before the column existed
            self._db.execute("ALTER TABLE runs ADD COLUMN workflow_ref TEXT")
        row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer durable-sandbox (schema {row[0]} > {SCHEMA_VERSION}); upgrade."
            )

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r}, durability={self.durability!r})"

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._check_file()
        db = self._db
        with self._errors():
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # SQLite may have rolled back already (disk full does)
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # ------------------------------------------------------------------ runs

    @property
    def _where(self) -> str:
        return f"store {self.path}"

    def _run_from_row(self, row: Sequence[Any]) -> RunRecord:
        return run_from_row(row, self._where)

    async def create_run(self, run: RunRecord) -> tuple[RunRecord, bool]:
        with self._tx() as db:
            row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run.run_id,)).fetchone()
            if row is not None:
                return self._run_from_row(row), False
            db.execute(f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({','.join('?' * len(RUN_COLUMNS))})",
                       run_values(run))
        return run, True

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._query(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run_id,))
        return self._run_from_row(rows[0]) if rows else None

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        where: list[str] = []
        args: list[Any] = []
        if status:
            where.append(f"status IN ({','.join('?' * len(status))})")
            args.extend(RunStatus(s).value for s in status)
        if workflow:
            where.append("workflow=?")
            args.append(workflow)
        sql = f"SELECT {_RUN_COLUMNS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC LIMIT ?"
        args.append(limit)
        return [self._run_from_row(r) for r in self._query(sql, args)]

    @staticmethod
    def _run_changes(changes: dict[str, Any]) -> tuple[str, list[Any]]:
        cols, vals = [], []
        for key, value in changes.items():
            cols.append(f"{key}=?")
            vals.append(change_value(key, value))
        cols.append("updated_at=?")
        vals.append(time.time())
        return ", ".join(cols), vals

    def _check_fence(self, db: sqlite3.Connection, run_id: str, fence: int, check_cancel: bool) -> None:
        row = db.execute("SELECT fence, cancel_requested FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None or row[0] != fence:
            raise LeaseLost(run_id, fence)
        if check_cancel and row[1] is not None:
            raise RunCancelledError(run_id, row[1])

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        sets, vals = self._run_changes(changes)
        with self._tx() as db:
            if fence is not None:
                self._check_fence(db, run_id, fence, False)
            db.execute(f"UPDATE runs SET {sets} WHERE run_id=?", (*vals, run_id))

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        # One transaction: a reader sees the whole run or nothing of it, never a run without its journal.
        with self._tx() as db:
            row = db.execute("SELECT fence FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                return False
            if fence is not None and row[0] != fence:
                raise LeaseLost(run_id, fence)
            for table in ("ops", "events", "signals", "runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
        return True

    # ------------------------------------------------------------------ journal

    @staticmethod
    def _op_values(run_id: str, r: OperationRecord) -> tuple[Any, ...]:
        return (run_id, r.op_id, r.kind, r.name, r.status, r.attempt, r.input_digest, *op_cells(r), r.ts, r.epoch)

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        db = self._db
        records = commit.records
        if (0 < len(records) <= _OP_FENCED_MAX and not commit.run and commit.thread_state is None
                and commit.cache is None):
            # The step path (see _OP_FENCED): one statement instead of BEGIN/SELECT/INSERT.../COMMIT.
            self._unchecked += 1
            if self._unchecked >= _IDENTITY_CHECK_EVERY:
                self._unchecked = 0
                self._check_file()
            values = [v for rec in records for v in self._op_values(run_id, rec)]
            try:  # not self._errors(): a context manager costs a few percent of a no-op step here
                cur = db.execute(_OP_FENCED[len(records), commit.check_cancel], (*values, run_id, fence))
            except sqlite3.Error as e:
                raise StoreError(f"Store {self.path}: {_explain(e)}") from None
            if cur.rowcount != len(records):
                with self._tx() as tx:
                    self._check_fence(tx, run_id, fence, commit.check_cancel)
                raise LeaseLost(run_id, fence)  # pragma: no cover - _check_fence raised already
            for seq, rec in enumerate(records, start=(cur.lastrowid or 0) - len(records) + 1):
                rec.seq = seq
            return
        with self._tx() as tx:
            self._check_fence(tx, run_id, fence, commit.check_cancel)
            for r in commit.records:
                r.seq = tx.execute(_OP_INSERT, self._op_values(run_id, r)).lastrowid or 0
            if commit.run:
                sets, vals = self._run_changes(commit.run)
                tx.execute(f"UPDATE runs SET {sets} WHERE run_id=?", (*vals, run_id))
            if commit.thread_state is not None:
                tid, state = commit.thread_state
                tx.execute(
                    "INSERT INTO threads VALUES (?,?,?) ON CONFLICT(thread_id) DO UPDATE SET state=excluded.state, "
                    "updated_at=excluded.updated_at",
                    (tid, dumps(state), time.time()),
                )
            if commit.cache is not None:
                key, value, expires = commit.cache
                tx.execute("INSERT OR REPLACE INTO cache VALUES (?,?,?,?)", (key, dumps(value), time.time(), expires))

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self.journal_since(run_id, 0)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        rows = self._query(f"SELECT {_OP_COLUMNS} FROM ops WHERE run_id=? AND seq>? ORDER BY seq", (run_id, after_seq))
        return [op_from_row(r, run_id, self._where) for r in rows]

    # ------------------------------------------------------------------ leases

    def _take(self, db: sqlite3.Connection, run_id: str, owner: str, ttl: float) -> Lease:
        now = time.time()
        db.execute(
            "UPDATE runs SET lease_owner=?, lease_expires_at=?, fence=fence+1 WHERE run_id=?",
            (owner, now + ttl, run_id),
        )
        fence = db.execute("SELECT fence FROM runs WHERE run_id=?", (run_id,)).fetchone()[0]
        return Lease(run_id, owner, fence, now + ttl)

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        with self._tx() as db:
            row = db.execute("SELECT lease_owner, lease_expires_at FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                from durable_sandbox.engine.errors import RunNotFound

                raise RunNotFound(run_id)
            holder, expires = row
            held = holder is not None and holder != owner and expires is not None and expires > time.time()
            if held and (take_over_from is None or holder != take_over_from):
                raise LeaseHeld(run_id, holder, expires)
            return self._take(db, run_id, owner, ttl)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        expires = time.time() + ttl
        with self._tx() as db:
            cur = db.execute(
                "UPDATE runs SET lease_expires_at=? WHERE run_id=? AND fence=? AND lease_owner=?",
                (expires, lease.run_id, lease.fence, lease.owner),
            )
            if cur.rowcount != 1:
                raise LeaseLost(lease.run_id, lease.fence)
        return Lease(lease.run_id, lease.owner, lease.fence, expires)

    async def release(self, lease: Lease) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET lease_owner=NULL, lease_expires_at=NULL WHERE run_id=? AND fence=?",
                (lease.run_id, lease.fence),
            )

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None) -> Lease | None:
        now = time.time()
        sql = (
            "SELECT run_id FROM runs WHERE (lease_owner IS NULL OR lease_expires_at < ?) AND ("
            "status='pending' OR (status='waiting' AND wake_at IS NOT NULL AND wake_at <= ?) OR status='running'"
            " OR (cancel_requested IS NOT NULL AND status IN ('waiting','suspended')))"
        )
        args: list[Any] = [now, now]
        if workflows:
            sql += f" AND workflow IN ({','.join('?' * len(workflows))})"
            args.extend(workflows)
        sql += " ORDER BY updated_at LIMIT 1"
        with self._tx() as db:
            row = db.execute(sql, args).fetchone()
            if row is None:
                return None
            return self._take(db, row[0], owner, ttl)

    # ------------------------------------------------------------------ signals, cache, thread state

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        with self._tx() as db:
            row = db.execute(
                "SELECT value FROM signals WHERE run_id=? AND callback_id=?", (run_id, callback_id)
            ).fetchone()
            if row is not None:
                if canonical(json.loads(row[0])) == canonical(value):
                    return False
                raise SignalConflict(run_id, callback_id)
            db.execute("INSERT INTO signals VALUES (?,?,?,?)", (run_id, callback_id, dumps(value), time.time()))
        return True

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        rows = self._query("SELECT callback_id, value FROM signals WHERE run_id=?", (run_id,))
        return {cb: json.loads(v) for cb, v in rows}

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        rows = self._query(
            "SELECT value, created_at FROM cache WHERE key=? AND (expires_at IS NULL OR expires_at > ?)", (key, now)
        )
        return (json.loads(rows[0][0]), rows[0][1]) if rows else None

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        with self._tx() as db:
            if key is not None:
                cur = db.execute("DELETE FROM cache WHERE key=?", (key,))
            elif prefix is not None:
                cur = db.execute("DELETE FROM cache WHERE substr(key, 1, ?)=?", (len(prefix), prefix))
            else:
                cur = db.execute("DELETE FROM cache")
            return cur.rowcount

    async def get_thread_state(self, thread_id: str) -> Any:
        rows = self._query("SELECT state FROM threads WHERE thread_id=?", (thread_id,))
        return json.loads(rows[0][0]) if rows else None

    # ------------------------------------------------------------------ events

    async def append_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO events (run_id, type, data, ts) VALUES (?,?,?,?)",
                [(e.run_id, e.type, dumps(e.data), e.ts) for e in events],
            )

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        rows = self._query(
            "SELECT seq, type, data, ts FROM events WHERE run_id=? AND seq>? ORDER BY seq LIMIT ?",
            (run_id, after, limit),
        )
        return [Event(run_id, t, json.loads(d), ts, seq) for seq, t, d, ts in rows]

    # ------------------------------------------------------------------ housekeeping

    async def close(self) -> None:
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            pass  # another process holds it busy; it will checkpoint later
        self._db.close()
