"""Where the local provider keeps things under ``<home>/local/`` (the package docstring has the layout), the ids
it hands out, the temp-file writer tags that tell a live writer's files from a killed one's, and the delete
that tolerates a concurrent one."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from durable_sandbox.process_identity import process_start

SANDBOX_ID = re.compile(r"lsb-[0-9a-f]{12}")
SNAPSHOT_ID = re.compile(r"lsnap-[0-9a-f]{24}")


class LocalDirectories(NamedTuple):
    workspaces: Path
    snapshots: Path
    leases: Path
    env: Path


def default_home() -> Path:
    env = os.environ.get("DURABLE_SANDBOX_HOME")
    return Path(env) if env else Path.home() / ".local" / "state" / "durable-sandbox"


def snapshot_id_for(operation_id: str) -> str:
    """The snapshot id for an operation id: deterministic, so a retried snapshot finds the first one."""
    return "lsnap-" + hashlib.sha256(operation_id.encode("utf-8")).hexdigest()[:24]


def new_sandbox_id() -> str:
    return f"lsb-{uuid.uuid4().hex[:12]}"


# Temp files carry "<pid>-<start time>" of the process writing them, so a later start can tell the
# temp file of a live writer (leave it) from a killed one's (remove it).
WRITER_TAG = f"{os.getpid()}-{process_start(os.getpid())}"


def writer_alive(name: str) -> bool:
    parts = name.split(".")
    tag = parts[-3] if len(parts) >= 4 else ""
    pid, _, start = tag.partition("-")
    if not pid.isdigit():
        return False  # not written by this version: nobody will finish it
    return process_start(int(pid)) == start


def temp_path(directory: Path, name: str) -> Path:
    """A temp file for ``name`` in ``directory``, tagged with its writer (see ``writer_alive``)."""
    return directory / f".{name}.{WRITER_TAG}.{uuid.uuid4().hex[:8]}.tmp"


REMOVALS = (os.rmdir, os.unlink, os.remove)


def rmtree(path: Path) -> None:
    """Delete ``path`` and everything below it; parts that someone else deletes meanwhile are fine.

    Two deletes of one tree do meet: every provision and restore sweeps ``.trash-*`` (cleanup_expired) while
    a destroy in another task or process is still deleting its own trash there."""

    def on_error(function: Callable[..., Any], failed: str, exc_info: tuple[Any, BaseException, Any]) -> None:
        exc = exc_info[1]
        if isinstance(exc, FileNotFoundError):
            return  # already gone: what we wanted
        if function not in REMOVALS:
            raise exc  # e.g. a directory that cannot be opened or listed: say so, with its path
        # Read-only directories (module caches do this) would otherwise make the delete fail.
        with contextlib.suppress(OSError):
            parent = os.path.dirname(failed)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        with contextlib.suppress(FileNotFoundError):
            function(failed)

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, onerror=on_error)


class LocalLayout:
    """The directories of a local provider's home, what is in them, and the sweep of what a crash left."""

    def __init__(self, home: Path | str | None) -> None:
        self._home = Path(home).expanduser() if home is not None else default_home()
        self._root = self._home / "local"
        # Workspaces may hold whatever the agent wrote (tokens included): keep them private to the user.
        self._root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for directory in self.directories():
            directory.mkdir(exist_ok=True, mode=0o700)

    @property
    def home(self) -> Path:
        return self._home

    @property
    def root(self) -> Path:
        return self._root

    @property
    def workspaces_dir(self) -> Path:
        return self._root / "workspaces"

    @property
    def snapshots_dir(self) -> Path:
        return self._root / "snapshots"

    @property
    def leases_dir(self) -> Path:
        return self._root / "leases"

    @property
    def env_dir(self) -> Path:
        return self._root / "env"

    def directories(self) -> LocalDirectories:
        return LocalDirectories(self.workspaces_dir, self.snapshots_dir, self.leases_dir, self.env_dir)

    @property
    def snapshot_tags_dir(self) -> Path:
        return self._root / "snapshot-tags"

    def leftovers(self) -> list[Path]:
        """Every entry in the provider's directories, hidden temp (``.*.tmp``) and trash (``.trash-*``)
        entries included: empty when clean. The crash tests' leak check."""
        found: list[Path] = []
        for directory in (*self.directories(), self.snapshot_tags_dir):
            if directory.is_dir():
                found.extend(sorted(directory.iterdir()))
        return found

    def sweep_leftovers(self) -> list[Path]:
        """Remove what a killed process left half-done: temp files of snapshots and leases whose writer
        is dead, trash of destroyed workspaces, and staged restores without a lease. Runs when the
        provider starts; returns what it removed."""
        removed: list[Path] = []
        for directory in (self.snapshots_dir, self.leases_dir, self.env_dir, self.snapshot_tags_dir):
            for entry in directory.glob(".*.tmp"):
                if not writer_alive(entry.name):
                    entry.unlink(missing_ok=True)
                    removed.append(entry)
        for entry in self.workspaces_dir.glob(".*"):
            name = entry.name
            # Trash is only ever deleted, so deleting it alongside a live process's delete is harmless.
            orphaned_restore = name.startswith(".restore-") and not self._lease_path(name[len(".restore-"):]).exists()
            if name.startswith(".trash-") or orphaned_restore:
                rmtree(entry)
                removed.append(entry)
        return removed

    def workspace_path(self, sandbox_id: str) -> Path:
        return self.workspaces_dir / sandbox_id

    def _lease_path(self, sandbox_id: str) -> Path:
        return self.leases_dir / f"{sandbox_id}.json"

    def _env_path(self, sandbox_id: str) -> Path:
        return self.env_dir / f"{sandbox_id}.json"

    def _snapshot_path(self, snapshot_id: str) -> Path:
        return self.snapshots_dir / f"{snapshot_id}.tar"

    def list_snapshots(self) -> list[str]:
        return sorted(
            p.name[: -len(".tar")]
            for p in self.snapshots_dir.glob("lsnap-*.tar")
            if SNAPSHOT_ID.fullmatch(p.name[: -len(".tar")])
        )
