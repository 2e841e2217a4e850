"""Snapshot archives: a workspace written to a plain tar within a byte budget, and extracted with tarfile's
``data`` filter (links pointing outside the workspace recreated last, when nothing can be written through them)."""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO

from durable_sandbox.providers.archive_limit import ArchiveBudget
from durable_sandbox.providers.contract import safe_relative_path

# A regular file is opened without blocking (a FIFO swapped in since it was listed would block for ever) and
# without following a last-moment symlink; what was opened is then described from the open file itself.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def write_tar(workspace: Path, destination: Path, budget: ArchiveBudget) -> None:
    """The workspace as a plain tar: directories, regular files, symlinks and hard links (a restore's data filter
    would refuse device files and FIFOs, failing recovery later: they are left out). The sandbox's own processes
    may change the workspace while it is read: an entry removed after it was listed is left out (as if removed
    just before), and a file is archived as its open file says (kind and size), so none of that fails the
    snapshot."""
    if not workspace.is_dir():
        raise FileNotFoundError(workspace)
    with tarfile.open(destination, "w") as tar:
        _add_tree(tar, workspace, "", budget)


def _add_tree(tar: tarfile.TarFile, directory: Path, prefix: str, budget: ArchiveBudget) -> None:
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        if not prefix:
            raise  # the workspace itself is gone
        return  # removed (or replaced) after it was listed
    for name in names:
        _add(tar, directory / name, f"{prefix}{name}", budget)


def _add(tar: tarfile.TarFile, path: Path, arcname: str, budget: ArchiveBudget) -> None:
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode):
            _add_file(tar, path, arcname, budget)
            return
        if not (stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            return
        info = tar.gettarinfo(str(path), arcname)
    except FileNotFoundError:
        return  # removed after it was listed
    if not (info.isdir() or info.issym()):
        return  # changed kind since: as if it changed just after the snapshot
    budget.spend(tarfile.BLOCKSIZE)
    tar.addfile(info)
    if info.isdir():
        _add_tree(tar, path, f"{arcname}/", budget)


def _add_file(tar: tarfile.TarFile, path: Path, arcname: str, budget: ArchiveBudget) -> None:
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):  # removed, or swapped for a symlink or a socket
            return
        raise
    with os.fdopen(fd, "rb") as f:
        info = tar.gettarinfo(arcname=arcname, fileobj=f)  # the open file's own kind and size (a hard link's too)
        if info.isreg():
            budget.spend(tarfile.BLOCKSIZE + info.size)  # before its bytes are written: never past the limit
            tar.addfile(info, _Padded(f))
        elif info.islnk():
            budget.spend(tarfile.BLOCKSIZE)
            tar.addfile(info)


class _Padded:
    """A file read for exactly the size it had when opened: one that shrank meanwhile (the sandbox's processes
    truncating it) reads as zeros past its end, as GNU tar pads it, instead of failing the snapshot."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def read(self, size: int = -1, /) -> bytes:
        data = self._f.read(size)
        return data + bytes(max(0, size - len(data)))


def extract_tar(source: Path, destination: Path) -> None:
    destination.mkdir(mode=0o700)
    deferred: list[tarfile.TarInfo] = []

    def data_or_defer(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        try:
            return tarfile.data_filter(member, dest)
        except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
            # The data filter has already checked the member's own name; only its target is outside.
            if member.issym():
                deferred.append(member)
                return None
            raise

    with tarfile.open(source, "r") as tar:
        tar.extractall(destination, filter=data_or_defer)
    # Created last, so no member can be extracted through one of these links.
    root = os.path.realpath(destination)
    for member in deferred:
        try:
            link = os.path.join(root, safe_relative_path(member.name))
        except ValueError as e:
            raise tarfile.OutsideDestinationError(member, member.name) from e
        parent = os.path.realpath(os.path.dirname(link))
        if os.path.commonpath([parent, root]) != root:
            raise tarfile.OutsideDestinationError(member, link)
        try:
            os.makedirs(parent, exist_ok=True)
            os.symlink(member.linkname, os.path.join(parent, os.path.basename(link)))
        except OSError as e:
            raise tarfile.ExtractError(f"cannot create symlink {member.name}: {e}") from e
