"""Snapshots of workspaces: the tar published under a deterministic id, the tags (owner, labels) kept beside it
for the inventory, and what a failed restore means (gone, unrestorable, or worth a retry)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_sandbox.providers.archive_limit import ArchiveBudget
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SnapshotEntry,
    tag_key,
)
from durable_sandbox.providers.local import archives
from durable_sandbox.providers.local.layout import SNAPSHOT_ID, LocalLayout, temp_path

# How big a snapshot may be (archive_limit.py): tarfile cannot keep a sparse file sparse, so without a limit
# `truncate -s 1T f` in a sandbox would write a terabyte of zeros here on every snapshot.
ENV_SNAPSHOT_LIMIT = "DSB_LOCAL_SNAPSHOT_LIMIT"
DEFAULT_SNAPSHOT_LIMIT = "1Gi"
SNAPSHOT_LIMIT_SETTING = f"{ENV_SNAPSHOT_LIMIT}, or LocalProvider(snapshot_limit=...)"


async def write_snapshot(layout: LocalLayout, sandbox_id: str, snapshot_id: str, limit: int,
                   exists: Callable[[str], bool]) -> None:
    """Write the workspace's tar to a temp file and publish it; never a snapshot of a workspace being deleted."""
    workspace = layout.workspace_path(sandbox_id)
    target = layout._snapshot_path(snapshot_id)
    tmp = temp_path(layout.snapshots_dir, snapshot_id)
    try:
        try:
            budget = ArchiveBudget(limit, f"snapshot of {sandbox_id}", SNAPSHOT_LIMIT_SETTING)
            # Called through its module: the crash tests put a writer that dies half-way in its place.
            await asyncio.to_thread(archives.write_tar, workspace, tmp, budget)
        except FileNotFoundError as e:
            if not exists(sandbox_id):
                raise SandboxGone(sandbox_id, "it disappeared during the snapshot") from e
            raise ProviderError(f"Snapshot of {sandbox_id} failed: {e}") from e
        except OSError as e:
            raise ProviderError(f"Snapshot of {sandbox_id} failed: {e}") from e
        # Never publish a snapshot of a workspace that was being deleted while it was read.
        if not exists(sandbox_id):
            raise SandboxGone(sandbox_id, "it disappeared during the snapshot")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_snapshot_tags(layout: LocalLayout, snapshot_id: str, lease: dict[str, Any]) -> None:
    """Keep the sandbox's owner and labels with the snapshot, before the snapshot exists: a snapshot
    whose writer dies right after it appears is still found by the inventory."""
    labels = dict(lease.get("labels") or {})
    if INSTALLATION_LABEL not in labels:
        return  # nobody can ask an inventory about it
    layout.snapshot_tags_dir.mkdir(exist_ok=True, mode=0o700)
    target = layout.snapshot_tags_dir / f"{snapshot_id}.json"
    tmp = temp_path(layout.snapshot_tags_dir, snapshot_id)
    try:
        tmp.write_text(json.dumps({"owner": lease.get("owner"), "labels": labels}, sort_keys=True), encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def copy_snapshot_files(layout: LocalLayout, snapshot_id: str, copy_id: str) -> None:
    """Snapshot ``snapshot_id``'s tags, then its tar, copied under ``copy_id`` (each to a temp file renamed into
    place: a copier killed half-way leaves no half copy, and tags first, so the inventory finds the copy)."""
    tags = layout.snapshot_tags_dir / f"{snapshot_id}.json"
    pairs = [(tags, layout.snapshot_tags_dir / f"{copy_id}.json")] if tags.is_file() else []
    pairs.append((layout.snapshots_dir / f"{snapshot_id}.tar", layout.snapshots_dir / f"{copy_id}.tar"))
    for source, target in pairs:
        tmp = temp_path(target.parent, copy_id)
        try:
            shutil.copyfile(source, tmp)
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


def inventory_snapshots(layout: LocalLayout, provider: str, installation: str) -> list[SnapshotEntry]:
    """The snapshots taken of sandboxes labelled with ``installation`` (their tags say so)."""
    entries = []
    for path in sorted(layout.snapshot_tags_dir.glob("lsnap-*.json")) if layout.snapshot_tags_dir.is_dir() else []:
        snapshot_id = path.name[: -len(".json")]
        if not SNAPSHOT_ID.fullmatch(snapshot_id) or not layout._snapshot_path(snapshot_id).is_file():
            continue  # being written, or its writer died before the tar appeared: nothing to sweep
        try:
            tags = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue  # deleted meanwhile
        except (OSError, ValueError) as e:
            raise ProviderError(f"Cannot read the tags of snapshot {snapshot_id}: {e}") from e
        labels = tags.get("labels") or {}
        if labels.get(INSTALLATION_LABEL) != installation:
            continue
        owner = tags.get("owner")
        entries.append(SnapshotEntry(
            id=snapshot_id, provider=provider, installation_key=tag_key(installation),
            owner_key=tag_key(owner) if isinstance(owner, str) else None, retained=RETAIN_LABEL in labels,
        ))
    return entries


def restore_failure(e: BaseException, snapshot_id: str, source: Path) -> ProvisionError | None:
    """What a restore that failed with ``e`` raises (None: ``e`` itself)."""
    if isinstance(e, FileNotFoundError) and not source.exists():
        return ProvisionError(f"Snapshot {snapshot_id} does not exist", retryable=False)
    if isinstance(e, tarfile.TarError):
        return ProvisionError(f"Snapshot {snapshot_id} cannot be restored: {e}", retryable=False)
    if isinstance(e, OSError):
        return ProvisionError(f"Restoring snapshot {snapshot_id} failed: {e}", retryable=True)
    return None
