"""The ``local`` sandbox provider: subprocess workspaces on this machine.

**Development only. This is not a security boundary.** Tool calls run as the current user, with the
current user's privileges, network and filesystem access; the workspace directory is a convenience, not
a jail. Path checks on ``write_file``/``read_file``/``cwd`` stop honest mistakes (absolute paths, ``..``,
symlinks leading out of the workspace), not an adversary. The operator refuses this provider unless it is
explicitly enabled.

Layout under ``<home>/local/`` (``home`` defaults to ``$DURABLE_SANDBOX_HOME`` or
``~/.local/state/durable-sandbox``)::

    workspaces/<sandbox-id>/      the sandbox's files; the shell's cwd and $HOME
    snapshots/<snapshot-id>.tar   snapshots (plain tar, written to a temp file then renamed into place)
    snapshot-tags/<snapshot-id>.json  owner and labels of the sandbox a snapshot was taken of, written
                                  before the tar, for snapshots of sandboxes labelled with an installation
    leases/<sandbox-id>.json      owner, labels, template, expires_at, suspended (never env values)
    env/<sandbox-id>.json         the sandbox's ``spec.env`` (mode 0600): it belongs to the sandbox

Behaviour worth knowing:

* A lease file is written before its workspace exists and removed only after the workspace is gone, so
  every workspace has a lease and lease expiry is a complete leak backstop. Nothing runs in the
  background: an expired sandbox is reaped when it is next touched (it is then :class:`SandboxGone`),
  by :meth:`LocalProvider.cleanup_expired`, and opportunistically on every provision/restore. The lease
  keeps running while a sandbox is suspended, so a suspended sandbox cannot leak either.
* ``spec.env`` belongs to the sandbox, as E2B keeps a sandbox's ``envVars``: every call in it sees the
  env, whichever process or provider instance runs the call (a Workflow running in a Sandbox resource's
  sandbox, a run continued by another operator replica or after a restart). It may hold secrets, so it
  is kept apart from the lease (which ``dsb`` and tests read) in ``env/<id>.json``, readable by this
  user only (like the workspaces, which hold whatever the agent wrote); it is written after the lease and
  before the workspace, removed before the lease, and never in a snapshot (a restore is given the env
  again through its spec). The call's own ``env`` argument overrides it.
* Each shell call runs ``<shell> -lc <command>`` in its own process group under a small supervisor
  process (``_call_supervisor.py``): when the call ends (exit, timeout, cancellation, destroy) or the
  worker dies (even by SIGKILL: the supervisor has a parent-death signal), the supervisor kills the group
  and every descendant, including processes that left the group with ``setsid`` (it is a child
  subreaper, so they stay its descendants). Background processes do not outlive a call. This matches
  what a snapshot can restore (files, not processes), so replaying calls after a restore sees the same
  world. What remains possible: a process started by another service on the call's behalf (``at``,
  ``systemd-run``). Because it is a login shell, ``/etc/profile`` may reset ``PATH``.
* Snapshots are restored with tarfile's ``data`` filter. Symlinks that point outside the workspace
  (an absolute ``.venv/bin/python`` link, say) are legitimate workspace content, so they are recreated
  after every other member has been extracted, when no later member can be written through them.
  Device files and FIFOs are not snapshotted.
* Destroy and loss injection kill the process groups of calls still running; those calls then raise
  :class:`SandboxGone` rather than return a result from a sandbox that no longer exists.
* Handle metadata is non-secret only: the workspace path, the owner and the spec's labels.
* Delivery is at least once: tool calls are not deduplicated by operation id. Calls without a
  ``timeout`` argument have none.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from durable_sandbox.providers.archive_limit import ArchiveBudget, ArchiveTooLarge, configured_limit
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
    RETAIN_LABEL,
    TOOL_TYPES,
    Capability,
    ConfigurationError,
    ProviderCapabilities,
    ProviderError,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    SnapshotEntry,
    ToolCall,
    ToolResult,
    file_not_found_result,
    safe_relative_path,
    tag_key,
    unsupported_tool_result,
    wrote_file_result,
)
from durable_sandbox.providers.output import OutputBuffer

__all__ = [
    "LocalDirectories",
    "LocalProvider",
    "SandboxSuspendedError",
    "default_home",
    "snapshot_id_for",
]

_SANDBOX_ID = re.compile(r"lsb-[0-9a-f]{12}")
_SNAPSHOT_ID = re.compile(r"lsnap-[0-9a-f]{24}")
# How big a snapshot may be (archive_limit.py): tarfile cannot keep a sparse file sparse, so without a limit
# `truncate -s 1T f` in a sandbox would write a terabyte of zeros here on every snapshot.
ENV_SNAPSHOT_LIMIT = "DSB_LOCAL_SNAPSHOT_LIMIT"
DEFAULT_SNAPSHOT_LIMIT = "1Gi"
_SNAPSHOT_LIMIT_SETTING = f"{ENV_SNAPSHOT_LIMIT}, or LocalProvider(snapshot_limit=...)"
_ENV_NAME = re.compile(r"[^=\0]+")
_TIMEOUT_EXIT_CODE = 124
# How long to keep reading output after a call's process group was killed. Only a process that escaped
# the group (setsid) can still hold the pipes open; its output is not worth hanging the call for.
_DRAIN_GRACE_SECONDS = 1.0
# How long a call's supervisor may take to kill the call's processes before it is killed itself.
_STOP_GRACE_SECONDS = 5.0
_SUPERVISOR = Path(__file__).with_name("_call_supervisor.py")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

_CAPABILITIES = ProviderCapabilities(
    supported=frozenset(
        {
            Capability.SNAPSHOT,
            Capability.SNAPSHOT_DELETION,
            Capability.SNAPSHOT_RECONCILIATION,
            Capability.RESTORE,
            Capability.SUSPEND,
            Capability.RESUME,
            Capability.LEASE_RECONCILIATION,
            Capability.LOSS_INJECTION,
            Capability.INVENTORY,
            Capability.PROCESS_RESET,
        }
    ),
    delivery_guarantee="at_least_once_effects",
    idempotent_destroy=True,
    maximum_lease_seconds=86_400,
    tool_types=TOOL_TYPES,
)


class SandboxSuspendedError(ProviderError):
    """A tool call was sent to a suspended sandbox. Retrying cannot help until someone resumes it."""

    retryable = False

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        super().__init__(f"Sandbox {sandbox_id} is suspended; resume it before executing tool calls")


class _InvalidLease(ProviderError):
    retryable = False


class LocalDirectories(NamedTuple):
    workspaces: Path
    snapshots: Path
    leases: Path
    env: Path


class _Refused(Exception):
    """A tool call that fails as a result (exit 1, this stderr) rather than as an exception."""

    def __init__(self, stderr: str) -> None:
        super().__init__(stderr)
        self.stderr = stderr


def default_home() -> Path:
    env = os.environ.get("DURABLE_SANDBOX_HOME")
    return Path(env) if env else Path.home() / ".local" / "state" / "durable-sandbox"


def snapshot_id_for(operation_id: str) -> str:
    """The snapshot id for an operation id: deterministic, so a retried snapshot finds the first one."""
    return "lsnap-" + hashlib.sha256(operation_id.encode("utf-8")).hexdigest()[:24]


class LocalProvider(SandboxProvider):
    """Subprocess workspaces under ``<home>/local`` (see the module docstring; development only)."""

    name = "local"

    def __init__(
        self,
        home: Path | str | None = None,
        *,
        shell: str = "bash",
        clock: Callable[[], float] = time.time,
        snapshot_limit: int | None = None,
    ) -> None:
        if not shell:
            raise ConfigurationError("The local provider needs a shell to run commands with")
        self.snapshot_limit = snapshot_limit if snapshot_limit is not None else configured_limit(
            os.environ, ENV_SNAPSHOT_LIMIT, DEFAULT_SNAPSHOT_LIMIT, "the local provider's default")
        self._home = Path(home).expanduser() if home is not None else default_home()
        self._root = self._home / "local"
        self._shell = shell
        self._clock = clock
        # What this instance knows of each sandbox's env (env/<id>.json has it for the others).
        self._env: dict[str, dict[str, str]] = {}
        # Process groups of calls in flight, so a destroy or loss kills them instead of leaving them
        # running in a deleted directory.
        self._running: dict[str, set[int]] = {}
        # Workspaces may hold whatever the agent wrote (tokens included): keep them private to the user.
        self._root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for directory in self.directories():
            directory.mkdir(exist_ok=True, mode=0o700)
        self.sweep_leftovers()

    # ------------------------------------------------------------------------------------ layout

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
                if not _writer_alive(entry.name):
                    entry.unlink(missing_ok=True)
                    removed.append(entry)
        for entry in self.workspaces_dir.glob(".*"):
            name = entry.name
            # Trash is only ever deleted, so deleting it alongside a live process's delete is harmless.
            orphaned_restore = name.startswith(".restore-") and not self._lease_path(name[len(".restore-"):]).exists()
            if name.startswith(".trash-") or orphaned_restore:
                _rmtree(entry)
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
            if _SNAPSHOT_ID.fullmatch(p.name[: -len(".tar")])
        )

    # ------------------------------------------------------------------------------------ contract

    def capabilities(self) -> ProviderCapabilities:
        return _CAPABILITIES

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        self._check_provision_args(spec, lease_seconds)
        await self.cleanup_expired()
        sandbox_id = _new_sandbox_id()
        lease = self._new_lease(sandbox_id, spec, lease_seconds)
        self._write_lease(lease)
        try:
            self._write_env(sandbox_id, spec.env)
            self.workspace_path(sandbox_id).mkdir(mode=0o700)
        except OSError as e:
            self._env_path(sandbox_id).unlink(missing_ok=True)
            self._lease_path(sandbox_id).unlink(missing_ok=True)
            raise ProvisionError(f"Cannot create workspace for {sandbox_id}: {e}", retryable=True) from e
        return self._handle(lease)

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        lease = await self._require_live(handle.id)
        if lease.get("suspended"):
            raise SandboxSuspendedError(handle.id)
        workspace = self.workspace_path(handle.id)
        try:
            if call.type == "shell":
                result = await self._shell_call(handle.id, workspace, call.args)
            elif call.type == "write_file":
                path, contents = _parse_args("write_file", call.args, required={"path": str, "contents": str})
                result = await asyncio.to_thread(_write_file, handle.id, workspace, path, contents)
            elif call.type == "read_file":
                (path,) = _parse_args("read_file", call.args, required={"path": str})
                result = await asyncio.to_thread(_read_file, handle.id, workspace, path)
            else:
                return unsupported_tool_result(call.type)
        except _Refused as refused:
            result = ToolResult(exit_code=1, stdout="", stderr=refused.stderr)
        # A destroy or loss while the call ran: its result describes a sandbox that no longer exists.
        if not self._exists(handle.id):
            await self._remove(handle.id)  # a write_file racing the destroy may have recreated directories
            raise SandboxGone(handle.id, "it was destroyed while the call ran")
        return result

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        if not isinstance(operation_id, str) or not operation_id:
            raise ValueError("snapshot needs a non-empty operation_id")
        snapshot_id = snapshot_id_for(operation_id)
        target = self._snapshot_path(snapshot_id)
        # Reconciliation comes first: if the first attempt's response was lost, the snapshot is there
        # even when the sandbox has since been lost.
        if target.exists():
            return snapshot_id
        lease = await self._require_live(handle.id)
        self._write_snapshot_tags(snapshot_id, lease)
        workspace = self.workspace_path(handle.id)
        tmp = self.snapshots_dir / f".{snapshot_id}.{_WRITER_TAG}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            try:
                budget = ArchiveBudget(self.snapshot_limit, f"snapshot of {handle.id}", _SNAPSHOT_LIMIT_SETTING)
                await asyncio.to_thread(_write_tar, workspace, tmp, budget)
            except FileNotFoundError as e:
                if not self._exists(handle.id):
                    raise SandboxGone(handle.id, "it disappeared during the snapshot") from e
                raise ProviderError(f"Snapshot of {handle.id} failed: {e}") from e
            except OSError as e:
                raise ProviderError(f"Snapshot of {handle.id} failed: {e}") from e
            # Never publish a snapshot of a workspace that was being deleted while it was read.
            if not self._exists(handle.id):
                raise SandboxGone(handle.id, "it disappeared during the snapshot")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return snapshot_id

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        self._check_provision_args(spec, lease_seconds)
        source = self._snapshot_path(snapshot_id)
        if not _SNAPSHOT_ID.fullmatch(snapshot_id) or not source.is_file():
            raise ProvisionError(f"Snapshot {snapshot_id} does not exist", retryable=False)
        if source.stat().st_size > self.snapshot_limit:  # tarfile writes no more than it reads: bounded here
            raise ArchiveTooLarge(f"restore of snapshot {snapshot_id}", self.snapshot_limit, _SNAPSHOT_LIMIT_SETTING)
        await self.cleanup_expired()
        sandbox_id = _new_sandbox_id()
        lease = self._new_lease(sandbox_id, spec, lease_seconds)
        self._write_lease(lease)
        staging = self.workspaces_dir / f".restore-{sandbox_id}"
        try:
            self._write_env(sandbox_id, spec.env)
            await asyncio.to_thread(_extract_tar, source, staging)
            # The workspace appears complete or not at all.
            os.rename(staging, self.workspace_path(sandbox_id))
        except BaseException as e:
            await asyncio.to_thread(_rmtree, staging)
            self._env_path(sandbox_id).unlink(missing_ok=True)
            self._lease_path(sandbox_id).unlink(missing_ok=True)
            if isinstance(e, FileNotFoundError) and not source.exists():
                raise ProvisionError(f"Snapshot {snapshot_id} does not exist", retryable=False) from e
            if isinstance(e, tarfile.TarError):
                raise ProvisionError(
                    f"Snapshot {snapshot_id} cannot be restored: {e}", retryable=False
                ) from e
            if isinstance(e, OSError):
                raise ProvisionError(f"Restoring snapshot {snapshot_id} failed: {e}", retryable=True) from e
            raise
        return self._handle(lease)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        if not _SNAPSHOT_ID.fullmatch(snapshot_id):
            return  # not one of ours, so there is nothing to delete
        try:
            self._snapshot_path(snapshot_id).unlink(missing_ok=True)
            (self.snapshot_tags_dir / f"{snapshot_id}.json").unlink(missing_ok=True)
        except OSError as e:
            raise ProviderError(f"Deleting snapshot {snapshot_id} failed: {e}") from e

    def _write_snapshot_tags(self, snapshot_id: str, lease: dict[str, Any]) -> None:
        """Keep the sandbox's owner and labels with the snapshot, before the snapshot exists: a snapshot
        whose writer dies right after it appears is still found by the inventory."""
        labels = dict(lease.get("labels") or {})
        if INSTALLATION_LABEL not in labels:
            return  # nobody can ask an inventory about it
        self.snapshot_tags_dir.mkdir(exist_ok=True, mode=0o700)
        target = self.snapshot_tags_dir / f"{snapshot_id}.json"
        tmp = self.snapshot_tags_dir / f".{snapshot_id}.{_WRITER_TAG}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            tmp.write_text(json.dumps({"owner": lease.get("owner"), "labels": labels}, sort_keys=True), encoding="utf-8")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        now = self._clock()
        return [
            self._handle(lease)
            for lease in self._iter_leases()
            if (lease.get("labels") or {}).get(INSTALLATION_LABEL) == installation and float(lease["expires_at"]) > now
        ]

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        entries = []
        for path in sorted(self.snapshot_tags_dir.glob("lsnap-*.json")) if self.snapshot_tags_dir.is_dir() else []:
            snapshot_id = path.name[: -len(".json")]
            if not _SNAPSHOT_ID.fullmatch(snapshot_id) or not self._snapshot_path(snapshot_id).is_file():
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
                id=snapshot_id, provider=self.name, installation_key=tag_key(installation),
                owner_key=tag_key(owner) if isinstance(owner, str) else None, retained=RETAIN_LABEL in labels,
            ))
        return entries

    async def suspend(self, handle: SandboxHandle) -> None:
        lease = await self._require_live(handle.id)
        if not lease.get("suspended"):
            lease["suspended"] = True
            self._write_lease(lease)

    async def resume(self, handle: SandboxHandle) -> SandboxHandle:
        lease = await self._require_live(handle.id)
        if lease.get("suspended"):
            lease["suspended"] = False
            self._write_lease(lease)
        return self._handle(lease)

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        problem = self._lease_seconds_problem(seconds)
        if problem:
            raise _InvalidLease(problem)
        lease = await self._require_live(handle.id)
        lease["expires_at"] = self._clock() + seconds
        self._write_lease(lease)
        return self._handle(lease)

    async def destroy(self, handle: SandboxHandle) -> None:
        await self._remove(handle.id)

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        now = self._clock()
        return [
            self._handle(lease)
            for lease in self._iter_leases()
            if lease.get("owner") == owner and float(lease["expires_at"]) > now
        ]

    async def reset_processes(self, handle: SandboxHandle) -> None:
        # Nothing a call starts outlives it: its supervisor ends the call's group, whatever left it (setsid,
        # nohup, a double fork: re-parented to the supervisor, a subreaper) when the call ends. What is left to
        # end is the calls still in flight.
        await self._require_live(handle.id)
        for supervisor in self._running.pop(handle.id, set()):
            _stop_call(supervisor)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        # A loss is indistinguishable from a destroy nobody asked for: files, lease and processes go.
        await self._remove(handle.id)

    async def aclose(self) -> None:
        """Nothing to release: no clients or pools. Sandboxes outlive the provider object by design."""

    async def cleanup_expired(self, now: float | None = None) -> list[str]:
        """Destroy every sandbox whose lease has expired (and workspaces left without a lease by a crash).

        Returns the ids destroyed. This is the leak backstop a real provider's server-side expiry gives.
        """
        now = self._clock() if now is None else now
        removed: list[str] = []
        for lease in self._iter_leases():
            if float(lease["expires_at"]) <= now:
                await self._remove(lease["id"])
                removed.append(lease["id"])
        for entry in sorted(self.workspaces_dir.iterdir()):
            name = entry.name
            if name.startswith(".trash-"):
                await asyncio.to_thread(_rmtree, entry)
            elif name.startswith(".restore-"):
                # A restore in flight (maybe in another process) has its lease already; a crashed one doesn't.
                if not self._lease_path(name[len(".restore-") :]).exists():
                    await asyncio.to_thread(_rmtree, entry)
            elif _SANDBOX_ID.fullmatch(name) and not self._lease_path(name).exists():
                await self._remove(name)
                removed.append(name)
        for entry in sorted(self.env_dir.glob("lsb-*.json")):
            if not self._lease_path(entry.name[: -len(".json")]).exists():  # a crash between env and lease removal
                entry.unlink(missing_ok=True)
        return removed

    # ------------------------------------------------------------------------------------ internals

    def _check_provision_args(self, spec: SandboxSpec, lease_seconds: int) -> None:
        problem = self._lease_seconds_problem(lease_seconds)
        if problem:
            raise ProvisionError(problem, retryable=False)
        for key, value in spec.env.items():
            if not _ENV_NAME.fullmatch(key) or "\0" in value:
                # Name the variable, never the value: it may be a secret.
                raise ProvisionError(
                    f"Invalid environment variable {key!r} in the sandbox spec", retryable=False
                )

    def _lease_seconds_problem(self, seconds: object) -> str | None:
        maximum = _CAPABILITIES.maximum_lease_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= maximum:
            return f"Lease of {seconds!r} seconds is invalid for the local provider: it must be in (0, {maximum}]"
        return None

    def _new_lease(self, sandbox_id: str, spec: SandboxSpec, lease_seconds: float) -> dict[str, Any]:
        now = self._clock()
        return {
            "id": sandbox_id,
            "owner": spec.owner,
            "labels": dict(spec.labels),
            # Templates are an e2b notion; recorded so manifests written for e2b still run locally.
            "template": spec.template,
            "created_at": now,
            "expires_at": now + lease_seconds,
            "suspended": False,
        }

    def _write_lease(self, lease: dict[str, Any]) -> None:
        target = self._lease_path(lease["id"])
        tmp = self.leases_dir / f".{lease['id']}.{_WRITER_TAG}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            tmp.write_text(json.dumps(lease, sort_keys=True), encoding="utf-8")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def _write_env(self, sandbox_id: str, env: Mapping[str, str]) -> None:
        """The sandbox's env, created readable by this user only (never widened by the umask)."""
        self._env[sandbox_id] = dict(env)
        target = self._env_path(sandbox_id)
        tmp = self.env_dir / f".{sandbox_id}.{_WRITER_TAG}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(dict(env), f, sort_keys=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def _sandbox_env(self, sandbox_id: str) -> dict[str, str]:
        known = self._env.get(sandbox_id)
        if known is not None:
            return known
        try:
            data = json.loads(self._env_path(sandbox_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}  # made by a version that kept the env in memory only
        except (OSError, ValueError) as e:
            # Never the content in the message: it may be a secret.
            raise ProviderError(f"Cannot read the env of {sandbox_id}: {type(e).__name__}") from None
        env = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
        self._env[sandbox_id] = env
        return env

    def _read_lease(self, sandbox_id: str) -> dict[str, Any] | None:
        if not _SANDBOX_ID.fullmatch(sandbox_id):
            return None
        try:
            data = json.loads(self._lease_path(sandbox_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ProviderError(f"Cannot read the lease of {sandbox_id}: {e}") from e
        return data if isinstance(data, dict) else None

    def _iter_leases(self) -> list[dict[str, Any]]:
        leases = []
        for path in sorted(self.leases_dir.glob("lsb-*.json")):
            with contextlib.suppress(ProviderError):
                lease = self._read_lease(path.name[: -len(".json")])
                if lease is not None:
                    leases.append(lease)
        return leases

    def _exists(self, sandbox_id: str) -> bool:
        return self._lease_path(sandbox_id).is_file() and self.workspace_path(sandbox_id).is_dir()

    async def _require_live(self, sandbox_id: str) -> dict[str, Any]:
        if not _SANDBOX_ID.fullmatch(sandbox_id):
            raise SandboxGone(sandbox_id, "not a sandbox of the local provider")
        lease = self._read_lease(sandbox_id)
        if lease is None:
            await self._remove(sandbox_id)
            raise SandboxGone(sandbox_id, "it has no lease")
        if not self.workspace_path(sandbox_id).is_dir():
            await self._remove(sandbox_id)
            raise SandboxGone(sandbox_id, "its workspace is missing")
        if float(lease["expires_at"]) <= self._clock():
            # Expiry is enforced when the sandbox is next touched; reap it as a real provider would have.
            await self._remove(sandbox_id)
            raise SandboxGone(sandbox_id, "its lease expired")
        return lease

    async def _remove(self, sandbox_id: str) -> None:
        if not _SANDBOX_ID.fullmatch(sandbox_id):
            return  # never let a foreign id address a path
        workspace = self.workspace_path(sandbox_id)
        trash = self.workspaces_dir / f".trash-{sandbox_id}-{uuid.uuid4().hex[:8]}"
        # Renaming first makes the sandbox vanish at once for concurrent calls; the slow delete follows.
        try:
            os.rename(workspace, trash)
            renamed = True
        except FileNotFoundError:
            renamed = False
        for supervisor in self._running.pop(sandbox_id, set()):
            _stop_call(supervisor)
        # The lease goes last, so a crash part-way leaves a lease that expiry will clean up.
        self._env_path(sandbox_id).unlink(missing_ok=True)
        self._env.pop(sandbox_id, None)
        self._lease_path(sandbox_id).unlink(missing_ok=True)
        if renamed:
            await asyncio.to_thread(_rmtree, trash)

    def _handle(self, lease: dict[str, Any]) -> SandboxHandle:
        return SandboxHandle(
            id=lease["id"],
            provider=self.name,
            metadata={
                "workspace": str(self.workspace_path(lease["id"])),
                "owner": lease.get("owner"),
                "labels": dict(lease.get("labels") or {}),
            },
            lease_expires_at=float(lease["expires_at"]),
        )

    async def _shell_call(self, sandbox_id: str, workspace: Path, args: dict[str, Any]) -> ToolResult:
        command, timeout, cwd, call_env = _parse_args(
            "shell",
            args,
            required={"command": str},
            optional={"timeout": (int, float), "cwd": str, "env": dict},
        )
        if not command:
            raise _Refused("Invalid arguments for shell: 'command' must be a non-empty string")
        if timeout is not None and (isinstance(timeout, bool) or not math.isfinite(timeout) or timeout <= 0):
            raise _Refused("Invalid arguments for shell: 'timeout' must be a positive number of seconds")
        run_dir = workspace
        if cwd is not None:
            run_dir = _resolve_inside(workspace, cwd)
            if not run_dir.is_dir():
                raise _Refused(f"Invalid arguments for shell: cwd {cwd} is not a directory in the workspace")
        env = {
            "PATH": os.environ.get("PATH", _DEFAULT_PATH),
            "HOME": str(workspace),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        env.update(self._sandbox_env(sandbox_id))
        if call_env is not None:
            for key, value in call_env.items():
                if (
                    not isinstance(key, str)
                    or not _ENV_NAME.fullmatch(key)
                    or not isinstance(value, str)
                    or "\0" in value
                ):
                    raise _Refused(
                        f"Invalid arguments for shell: env entry {key!r} must map a name to a string"
                    )
            env.update(call_env)

        shell = shutil.which(self._shell)
        if shell is None:
            raise ConfigurationError(f"The local provider's shell {self._shell!r} was not found")
        loop = asyncio.get_running_loop()
        # A protocol rather than asyncio.subprocess.Process: Process.wait() also waits for the pipes to
        # close, so a backgrounded child holding stdout would stall the call until it exited.
        # The call runs under a supervisor (see _call_supervisor.py) that kills every process of the
        # call when the call ends, and when this worker dies, even processes that left its group.
        spawn = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: _CallProtocol(loop),
                sys.executable,
                "-I",
                "-S",
                str(_SUPERVISOR),
                str(os.getpid()),
                shell,
                "-lc",
                command,
                cwd=run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a terminal's Ctrl-C reaches the worker, which stops the call
            )
        )
        try:
            # Shielded: cancelling subprocess_exec while it connects the pipes can hang forever on
            # CPython 3.11 (its cleanup waits for pipes that never connect).
            transport, protocol = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            await _discard_spawn(spawn)
            raise
        except FileNotFoundError as e:
            if not run_dir.is_dir():
                raise SandboxGone(sandbox_id, "its workspace is missing") from e
            raise ConfigurationError(f"The local provider's shell {self._shell!r} was not found") from e
        supervisor = transport.get_pid()
        self._running.setdefault(sandbox_id, set()).add(supervisor)
        if not self._exists(sandbox_id):
            # Destroyed while the process was starting, before destroy could know of it.
            _stop_call(supervisor)
        try:
            done, _ = await asyncio.wait([protocol.exited], timeout=timeout)
            timed_out = not done
        finally:
            # Also on cancellation: a cancelled step must not leave its command running.
            running = self._running.get(sandbox_id)
            if running is not None:
                running.discard(supervisor)
                if not running:
                    self._running.pop(sandbox_id, None)
            try:
                await _finish_call(supervisor, protocol)
            finally:
                transport.close()

        out, err = protocol.stdout.text(), protocol.stderr.text()
        sizes = {"stdout_size": protocol.stdout.full_size, "stderr_size": protocol.stderr.full_size}
        if timed_out:
            assert timeout is not None
            message = f"Command timed out after {timeout:g} seconds"
            separator = "\n" if err and not err.endswith("\n") else ""
            err = f"{err}{separator}{message}"
            return ToolResult(exit_code=_TIMEOUT_EXIT_CODE, stdout=out, stderr=err, **sizes)
        code = transport.get_returncode()
        if code is None:  # unreachable after SIGKILL unless the kernel is very slow; never report success
            raise ProviderError(f"The shell of {sandbox_id} did not exit after being killed")
        # Report death by signal the way a shell does (128 + signal), not as a negative number.
        return ToolResult(exit_code=code if code >= 0 else 128 - code, stdout=out, stderr=err, **sizes)


# ---------------------------------------------------------------------------------------- helpers


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (field 22 of /proc/<pid>/stat): with
    the pid it names one process for good, even after the pid is reused. (engine/owner.py reads it the
    same way for lease holders; providers import nothing of the engine, so each layer has its own.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return None
    return stat_line[stat_line.rfind(b")") + 2 :].split()[19].decode()


# Temp files carry "<pid>-<start time>" of the process writing them, so a later start can tell the
# temp file of a live writer (leave it) from a killed one's (remove it).
_WRITER_TAG = f"{os.getpid()}-{_process_start(os.getpid())}"


def _writer_alive(name: str) -> bool:
    parts = name.split(".")
    tag = parts[-3] if len(parts) >= 4 else ""
    pid, _, start = tag.partition("-")
    if not pid.isdigit():
        return False  # not written by this version: nobody will finish it
    return _process_start(int(pid)) == start


def _new_sandbox_id() -> str:
    return f"lsb-{uuid.uuid4().hex[:12]}"


def _parse_args(
    tool: str,
    args: dict[str, Any],
    *,
    required: dict[str, type],
    optional: dict[str, type | tuple[type, ...]] | None = None,
) -> list[Any]:
    """Check a call's arguments; a typo (``content`` for ``contents``) fails instead of being ignored."""
    optional = optional or {}
    unexpected = sorted(set(args) - set(required) - set(optional))
    if unexpected:
        raise _Refused(
            f"Invalid arguments for {tool}: unexpected argument(s) {', '.join(map(repr, unexpected))}"
        )
    values: list[Any] = []
    for key, kind in required.items():
        if key not in args:
            raise _Refused(f"Invalid arguments for {tool}: missing required argument {key!r}")
        if not isinstance(args[key], kind):
            raise _Refused(f"Invalid arguments for {tool}: {key!r} must be a {kind.__name__}")
        values.append(args[key])
    for key, kinds in optional.items():
        value = args.get(key)
        if value is not None and not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            raise _Refused(f"Invalid arguments for {tool}: {key!r} must be a {names}")
        values.append(value)
    return values


def _resolve_inside(workspace: Path, path: str) -> Path:
    """The real location of ``path`` in ``workspace``; refuses anything that ends up outside it."""
    try:
        relative = safe_relative_path(path)
    except ValueError as e:
        prefix = f"unsafe path {path!r}: "
        message = str(e)
        raise _Refused(f"Unsafe path: {path}: {message.removeprefix(prefix)}") from e
    root = workspace.resolve()
    try:
        target = (root / relative).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise _Refused(f"Unsafe path: {path}: it cannot be resolved ({e})") from e
    if not target.is_relative_to(root):
        raise _Refused(f"Unsafe path: {path}: it resolves outside the workspace through a symlink")
    return target


# Opening never blocks (a FIFO without a writer would block forever) and never follows a last-moment
# symlink; what was opened is then checked to be a regular file before a byte is read or written.
_OPEN_FLAGS = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def _not_regular(path: str, mode: int, verb: str) -> _Refused:
    if stat.S_ISDIR(mode):
        return _Refused(f"Cannot {verb[:-2] if verb == 'written' else verb} {path}: Is a directory")
    kind = (
        "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
        else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"
    )
    return _Refused(f"Cannot {'write' if verb == 'written' else verb} {path}: it is {kind}, not a regular file; "
                    f"only regular files can be {verb}")


def _write_file(sandbox_id: str, workspace: Path, path: str, contents: str) -> ToolResult:
    target = _resolve_inside(workspace, path)
    data = contents.encode("utf-8")
    # Without this check, creating parent directories would resurrect a destroyed workspace.
    if not workspace.is_dir():
        raise SandboxGone(sandbox_id, "its workspace is missing")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(target).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # before opening: never O_TRUNC a FIFO or device
                raise _not_regular(path, mode, "written")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _OPEN_FLAGS, 0o666)
        with os.fdopen(fd, "wb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise _not_regular(path, mode, "written")
            f.write(data)
    except OSError as e:
        raise _Refused(f"Cannot write {path}: {e.strerror or e}") from e
    return wrote_file_result(path, len(data))


def _read_file(sandbox_id: str, workspace: Path, path: str) -> ToolResult:
    target = _resolve_inside(workspace, path)
    try:
        fd = os.open(target, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        if not workspace.is_dir():
            raise SandboxGone(sandbox_id, "its workspace is missing") from None
        return file_not_found_result(path)
    except OSError as e:
        raise _Refused(f"Cannot read {path}: {e.strerror or e}") from e
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_regular(path, info.st_mode, "read")
    with os.fdopen(fd, "rb") as f:
        # Streaming and bounded: the first and last 64 KiB of a big file, never all of it in memory.
        buffer = OutputBuffer()
        try:
            buffer.feed(f.read(buffer.keep))
            rest = info.st_size - f.tell()
            if rest > buffer.keep:
                buffer.skip(rest - buffer.keep)
                f.seek(-buffer.keep, os.SEEK_END)
            while chunk := f.read(1 << 16):
                buffer.feed(chunk)
        except OSError as e:
            raise _Refused(f"Cannot read {path}: {e.strerror or e}") from e
    return ToolResult(exit_code=0, stdout=buffer.text(), stderr="", stdout_size=buffer.full_size)


async def _discard_spawn(spawn: asyncio.Future[tuple[asyncio.SubprocessTransport, _CallProtocol]]) -> None:
    """Let a spawn that the caller stopped waiting for finish, then kill what it started."""
    try:
        transport, _ = await spawn
    except Exception:
        return  # nothing was started
    _stop_call(transport.get_pid())
    transport.close()


class _CallProtocol(asyncio.SubprocessProtocol):
    """Collects a call's output and reports process exit and pipe closure separately."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Bounded: a call printing gigabytes costs 2 x 64 KiB per stream here (providers/output.py).
        self.stdout = OutputBuffer()
        self.stderr = OutputBuffer()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._open_pipes = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        (self.stdout if fd == 1 else self.stderr).feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def _stop_call(supervisor: int) -> None:
    """Ask a call's supervisor to kill every process of the call and exit (it does so at once)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(supervisor, signal.SIGTERM)


async def _finish_call(supervisor: int, protocol: _CallProtocol) -> None:
    """Make sure nothing of a call is left running, then collect what remains of its output."""
    if not protocol.exited.done():
        _stop_call(supervisor)
        done, _ = await asyncio.wait([protocol.exited], timeout=_STOP_GRACE_SECONDS)
        if not done:  # the supervisor is stuck: kill it; its shell then dies by its parent-death signal
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(supervisor, signal.SIGKILL)
    await asyncio.wait([protocol.exited, protocol.pipes_closed], timeout=_DRAIN_GRACE_SECONDS)


def _write_tar(workspace: Path, destination: Path, budget: ArchiveBudget) -> None:
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


def _extract_tar(source: Path, destination: Path) -> None:
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


_REMOVALS = (os.rmdir, os.unlink, os.remove)


def _rmtree(path: Path) -> None:
    """Delete ``path`` and everything below it; parts that someone else deletes meanwhile are fine.

    Two deletes of one tree do meet: every provision and restore sweeps ``.trash-*`` (cleanup_expired) while
    a destroy in another task or process is still deleting its own trash there."""

    def on_error(function: Callable[..., Any], failed: str, exc_info: tuple[Any, BaseException, Any]) -> None:
        exc = exc_info[1]
        if isinstance(exc, FileNotFoundError):
            return  # already gone: what we wanted
        if function not in _REMOVALS:
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
