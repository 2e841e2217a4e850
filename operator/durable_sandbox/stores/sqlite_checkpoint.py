"""The SQLite store's WAL checkpoints, kept off the commit path.

SQLite's own automatic checkpoint runs inside the ``COMMIT`` that takes the write-ahead log past its
threshold: that commit copies every page of the log into the database file and fsyncs it (17 ms for a
~16 MiB log), so whichever step, call or continue-as-new hand-over happens to land there pays for the
thousands of commits before it. The store's commit connection therefore has ``wal_autocheckpoint=0``, and
this class runs the checkpoints:

- every ``_LOOK_EVERY`` commits it looks at the log's size (one ``stat``);
- past ``pages`` pages it starts a ``PASSIVE`` checkpoint on a connection of its own in a short-lived
  thread (SQLite releases the GIL while it copies and fsyncs), unless one is running already;
- the log starts again at its beginning only once every frame in it is copied, and commits go on while the
  thread copies: the frames committed meanwhile (a few, where SQLite's own checkpoint copies thousands) are
  copied by the committing connection at its next look, so the log restarts;
- past ``HARD_FACTOR`` times that (the thread cannot keep up, or readers held the log), the committing
  connection checkpoints itself, as SQLite would have: the log stays bounded whatever the thread does.

Durability is unchanged: a transaction is durable once its ``COMMIT`` has appended it to the log (with
``synchronous=NORMAL`` against any process's death, with ``FULL`` also against a power cut, the log being
fsynced at each commit); a checkpoint only copies committed pages from the log into the database file and
never decides what is committed. A crash during a checkpoint leaves the log as it was, and the next
connection replays it. After a complete checkpoint the next write starts the log again from its
beginning and ``journal_size_limit`` truncates the file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path

__all__ = ["HARD_FACTOR", "WalCheckpoints"]

_LOOK_EVERY = 32
HARD_FACTOR = 4


class WalCheckpoints:
    """Checkpoints of one store file's WAL, off the commit path (see the module)."""

    def __init__(self, path: Path, *, pages: int, page_size: int) -> None:
        self._path = path
        self._wal = path.with_name(path.name + "-wal")
        self._soft = pages * page_size
        self._hard = self._soft * HARD_FACTOR
        self._commits = 0
        self._thread: threading.Thread | None = None
        self._own: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._tail = False  # the thread's last pass left frames committed meanwhile
        self.background = 0  # checkpoints the thread ran (tests and benchmarks read them)
        self.inline = 0  # checkpoints the committing connection ran, the log being past the hard bound

    def after_commit(self, db: sqlite3.Connection) -> None:
        """Called after each commit of ``db`` (the store's commit connection); looks every 32nd time."""
        self._commits += 1
        if self._commits < _LOOK_EVERY:
            return
        self._commits = 0
        running = self._thread is not None and self._thread.is_alive()
        if self._wal_size() >= self._hard:  # the thread cannot keep up, or readers held the log: copy it here
            if self._thread is not None and running:
                self._thread.join()
            self._tail = False
            self._inline(db)
        elif running:
            return
        elif self._tail:
            self._tail = False
            self._inline(db)  # the frames committed while the thread copied: a few, not thousands
        elif self._wal_size() >= self._soft:
            self._thread = threading.Thread(target=self._checkpoint, name="dsb-sqlite-checkpoint", daemon=True)
            self._thread.start()

    def _wal_size(self) -> int:
        try:
            return os.stat(self._wal).st_size
        except OSError:
            return 0

    def _inline(self, db: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.Error):  # busy: another connection checkpoints it
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        self.inline += 1

    def _checkpoint(self) -> None:
        with self._lock:
            try:
                if self._own is None:
                    self._own = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
                self._own.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                self.background += 1
                # Commits land while it copies (it copies what was in the log when it began), and the log
                # starts again at its beginning only once all of it is copied: the committing connection
                # copies those few frames itself at its next look.
                self._tail = True
            except sqlite3.Error:
                pass  # the store's next look starts another; past the hard bound the commit path does it

    def close(self) -> None:
        """Wait for a running checkpoint and close this class's connection (before the store's own)."""
        thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            if self._own is not None:
                self._own.close()
                self._own = None
