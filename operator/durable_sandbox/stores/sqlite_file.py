"""The SQLite store's file and its one connection: judging a path before SQLite touches it, opening it owner-only
in WAL mode, transactions, SQLite's errors said with the path and what to do, and noticing when the path stops
naming the file this process writes to. The store's jobs (``sqlite_runs.py``, ``sqlite_journal.py``, ...) are
built on this class; ``SqliteStore`` (``sqlite.py``) puts them together.

``wall_clock`` is the SQLite store's wall clock (leases, due runs, cache and thread-state times): the one place
tests move it (``durable_sandbox.testing.FakeClock``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from durable_sandbox.engine.errors import StoreError
from durable_sandbox.stores.sqlite_checkpoint import WalCheckpoints
from durable_sandbox.stores.sqlite_schema import create_or_migrate

__all__ = ["Durability", "SqliteFile", "default_home", "explain", "wall_clock"]

Durability = Literal["process", "fsync"]


def wall_clock() -> float:
    """The SQLite store's wall clock (see the module)."""
    return time.time()


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


def explain(error: sqlite3.Error) -> str:
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


class SqliteFile:
    """One store file and the connection to it (see the module)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, durability: Durability = "process",
                 checkpoint_pages: int = 4096) -> None:
        if durability not in ("process", "fsync"):
            raise ValueError(f"durability must be 'process' or 'fsync', not {durability!r}")
        if checkpoint_pages < 1:
            raise ValueError(f"checkpoint_pages must be at least 1, not {checkpoint_pages!r}")
        self.path = Path(path) if path is not None else default_home() / "runs.db"
        self.durability = durability
        _check_usable(self.path)
        try:
            self._open()
            self.checkpoints = self._bound_wal(checkpoint_pages)
        except sqlite3.Error as e:
            raise StoreError(f"Cannot open the store {self.path}: {explain(e)}") from None
        # Which file this process writes to: if the path stops naming it (the file or its directory
        # deleted or replaced), every later write would go to a file nobody will ever read again.
        self._path_text = str(self.path)
        self._identity = self._file_identity()
        self._unchecked = 0

    def _open(self) -> None:
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if self.durability == 'fsync' else 'NORMAL'}")
        self._db.execute("PRAGMA busy_timeout=30000")
        # Checkpointing the WAL back into the database file copies the log and fsyncs; SQLite's own
        # (automatic) checkpoint does it inside whichever COMMIT passes the threshold. The store runs
        # them itself, off the commit path (sqlite_checkpoint.py: every 4,096 pages by default, from a
        # thread). Neither changes what a commit guarantees.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        create_or_migrate(self._db, self.path)

    def _bound_wal(self, checkpoint_pages: int) -> WalCheckpoints:
        """journal_size_limit truncates the WAL when it starts again, to half the checkpoint threshold at
        most (so the file's size says how long the log is): the files on disk stay within the threshold of
        the data, four times it if checkpoints cannot keep up (sqlite_checkpoint.py)."""
        page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        limit = min(4 * 1024 * 1024, checkpoint_pages * page_size // 2)
        self._db.execute(f"PRAGMA journal_size_limit={limit}")
        return WalCheckpoints(self.path, pages=checkpoint_pages, page_size=page_size)

    @property
    def _where(self) -> str:
        return f"store {self.path}"

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

    def _check_file_now_and_then(self) -> None:
        """The step path's check of the file's identity: every _IDENTITY_CHECK_EVERY-th call (see there)."""
        self._unchecked += 1
        if self._unchecked >= _IDENTITY_CHECK_EVERY:
            self._unchecked = 0
            self._check_file()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's errors, said with the store's path and what to do."""
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(f"Store {self.path}: {explain(e)}") from None

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._errors():
            return self._db.execute(sql, args).fetchall()

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
        self.checkpoints.after_commit(db)

    async def close(self) -> None:
        self.checkpoints.close()
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            pass  # another process holds it busy; it will checkpoint later
        self._db.close()


def _check_usable(path: Path) -> None:
    """StoreError unless ``path`` can be this process's store file; made owner-only when it is."""
    problem = _path_problem(path)
    if problem is not None:
        raise StoreError(f"Cannot use {path} as a store: {problem}")
    if _read_only(path):
        raise StoreError(
            f"Cannot open the store {path}: it is read-only; make the file and its directory writable "
            f"(SQLite writes the -wal and -shm files beside it, even to read)"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"Cannot create the store's directory {path.parent}: {e.strerror or e}") from None
    try:
        _owner_only(path)
    except OSError as e:
        raise StoreError(f"Cannot open the store {path}: {e.strerror or e}") from None
