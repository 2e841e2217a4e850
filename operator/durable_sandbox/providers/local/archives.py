"""Snapshot archives: a workspace written to a plain tar within a byte budget, and extracted with tarfile's
``data`` filter (links pointing outside the workspace recreated last, when nothing can be written through them)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from durable_sandbox.providers.archive_limit import ArchiveBudget
from durable_sandbox.providers.contract import safe_relative_path


def write_tar(workspace: Path, destination: Path, budget: ArchiveBudget) -> None:
    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        # A restore (data filter) would refuse device files and FIFOs, failing recovery later; drop them now.
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            return None
        budget.spend(tarfile.BLOCKSIZE + member.size)  # before its bytes are written: never past the limit
        return member

    if not workspace.is_dir():
        raise FileNotFoundError(workspace)
    with tarfile.open(destination, "w") as tar:
        for name in sorted(os.listdir(workspace)):
            tar.add(workspace / name, arcname=name, recursive=True, filter=keep)


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
