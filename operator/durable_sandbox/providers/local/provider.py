"""The ``local`` sandbox provider: subprocess workspaces on this machine. ``LocalProvider`` is the contract's face;
the jobs are in this package's modules: ``layout`` (directories, ids, temp files), ``leases`` (lease and env files),
``arguments`` and ``files`` (a call's checks, ``write_file``/``read_file``), ``processes`` (shell calls and their
supervisors), ``snapshots`` and ``archives`` (tars, tags, the inventory).

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
  process (``providers/_call_supervisor.py``): when the call ends (exit, timeout, cancellation, destroy) or the
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
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_sandbox.providers.archive_limit import ArchiveTooLarge, configured_limit
from durable_sandbox.providers.contract import (
    INSTALLATION_LABEL,
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
    unsupported_tool_result,
)
from durable_sandbox.providers.dispatch import dispatch
from durable_sandbox.providers.local import archives, layout
from durable_sandbox.providers.local.arguments import parse_args
from durable_sandbox.providers.local.files import read_file, write_file
from durable_sandbox.providers.local.layout import (
    SANDBOX_ID,
    SNAPSHOT_ID,
    LocalLayout,
    new_sandbox_id,
    snapshot_id_for,
)
from durable_sandbox.providers.local.leases import LeaseFiles, check_provision_args, lease_seconds_problem
from durable_sandbox.providers.local.processes import ShellCalls
from durable_sandbox.providers.local.snapshots import (
    DEFAULT_SNAPSHOT_LIMIT,
    ENV_SNAPSHOT_LIMIT,
    SNAPSHOT_LIMIT_SETTING,
    copy_snapshot_files,
    inventory_snapshots,
    restore_failure,
    write_snapshot,
    write_snapshot_tags,
)

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
            Capability.OUTPUT_STREAMING,
            Capability.SNAPSHOT_COPY,
        }
    ),
    delivery_guarantee="at_least_once_effects",
    idempotent_destroy=True,
    maximum_lease_seconds=86_400,
    tool_types=TOOL_TYPES,
)
_MAXIMUM_LEASE = _CAPABILITIES.maximum_lease_seconds


class SandboxSuspendedError(ProviderError):
    """A tool call was sent to a suspended sandbox. Retrying cannot help until someone resumes it."""

    retryable = False

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        super().__init__(f"Sandbox {sandbox_id} is suspended; resume it before executing tool calls")


class _InvalidLease(ProviderError):
    retryable = False


class LocalProvider(LocalLayout, SandboxProvider):
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
        LocalLayout.__init__(self, home)
        self._shell = shell
        self._clock = clock
        self._env: dict[str, dict[str, str]] = {}
        self._running: dict[str, set[int]] = {}
        self._leases = LeaseFiles(self, clock, self._env)
        self._calls = ShellCalls(shell, self._running, self._leases.sandbox_env, self._exists)
        self.sweep_leftovers()

    # ------------------------------------------------------------------------------------ contract

    def capabilities(self) -> ProviderCapabilities:
        return _CAPABILITIES

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        check_provision_args(spec, lease_seconds, _MAXIMUM_LEASE)
        await self.cleanup_expired()
        sandbox_id = new_sandbox_id()
        lease = self._leases.new(sandbox_id, spec, lease_seconds)
        self._leases.write(lease)
        try:
            self._leases.write_env(sandbox_id, spec.env)
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

        async def shell(call: ToolCall) -> ToolResult:
            return await self._calls.call(handle.id, workspace, call.args)

        async def write(call: ToolCall) -> ToolResult:
            path, contents = parse_args("write_file", call.args, required={"path": str, "contents": str})
            return await asyncio.to_thread(write_file, handle.id, workspace, path, contents)

        async def read(call: ToolCall) -> ToolResult:
            (path,) = parse_args("read_file", call.args, required={"path": str})
            return await asyncio.to_thread(read_file, handle.id, workspace, path)

        if call.type not in TOOL_TYPES:
            return unsupported_tool_result(call.type)
        result = await dispatch(call, {"shell": shell, "write_file": write, "read_file": read})
        # A destroy or loss while the call ran: its result describes a sandbox that no longer exists.
        if not self._exists(handle.id):
            await self._remove(handle.id)  # a write_file racing the destroy may have recreated directories
            raise SandboxGone(handle.id, "it was destroyed while the call ran")
        return result

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        if not isinstance(operation_id, str) or not operation_id:
            raise ValueError("snapshot needs a non-empty operation_id")
        snapshot_id = snapshot_id_for(operation_id)
        # Reconciliation comes first: if the first attempt's response was lost, the snapshot is there
        # even when the sandbox has since been lost.
        if self._snapshot_path(snapshot_id).exists():
            return snapshot_id
        lease = await self._require_live(handle.id)
        write_snapshot_tags(self, snapshot_id, lease)
        await write_snapshot(self, handle.id, snapshot_id, self.snapshot_limit, self._exists)
        return snapshot_id

    async def copy_snapshot(self, snapshot_id: str, *, operation_id: str) -> str:
        if not operation_id:
            raise ValueError("copy_snapshot needs a non-empty operation_id")
        copy_id = snapshot_id_for(operation_id)
        if self._snapshot_path(copy_id).exists():  # a retry: the first copy was made
            return copy_id
        source = self._snapshot_path(snapshot_id)
        if not SNAPSHOT_ID.fullmatch(snapshot_id) or not source.is_file():
            raise ProvisionError(f"Snapshot {snapshot_id} does not exist (deleted by its owner?); nothing to copy",
                                 retryable=False)
        copy_snapshot_files(self, snapshot_id, copy_id)
        return copy_id

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        check_provision_args(spec, lease_seconds, _MAXIMUM_LEASE)
        source = self._snapshot_path(snapshot_id)
        if not SNAPSHOT_ID.fullmatch(snapshot_id) or not source.is_file():
            raise ProvisionError(f"Snapshot {snapshot_id} does not exist", retryable=False)
        if source.stat().st_size > self.snapshot_limit:  # tarfile writes no more than it reads: bounded here
            raise ArchiveTooLarge(f"restore of snapshot {snapshot_id}", self.snapshot_limit, SNAPSHOT_LIMIT_SETTING)
        await self.cleanup_expired()
        sandbox_id = new_sandbox_id()
        lease = self._leases.new(sandbox_id, spec, lease_seconds)
        self._leases.write(lease)
        staging = self.workspaces_dir / f".restore-{sandbox_id}"
        try:
            self._leases.write_env(sandbox_id, spec.env)
            await asyncio.to_thread(archives.extract_tar, source, staging)
            # The workspace appears complete or not at all.
            os.rename(staging, self.workspace_path(sandbox_id))
        except BaseException as e:
            await asyncio.to_thread(layout.rmtree, staging)
            self._env_path(sandbox_id).unlink(missing_ok=True)
            self._lease_path(sandbox_id).unlink(missing_ok=True)
            failure = restore_failure(e, snapshot_id, source)
            if failure is not None:
                raise failure from e
            raise
        return self._handle(lease)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        if not SNAPSHOT_ID.fullmatch(snapshot_id):
            return  # not one of ours, so there is nothing to delete
        try:
            self._snapshot_path(snapshot_id).unlink(missing_ok=True)
            (self.snapshot_tags_dir / f"{snapshot_id}.json").unlink(missing_ok=True)
        except OSError as e:
            raise ProviderError(f"Deleting snapshot {snapshot_id} failed: {e}") from e

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        now = self._clock()
        return [
            self._handle(lease)
            for lease in self._leases.all()
            if (lease.get("labels") or {}).get(INSTALLATION_LABEL) == installation and float(lease["expires_at"]) > now
        ]

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        return inventory_snapshots(self, self.name, installation)

    async def suspend(self, handle: SandboxHandle) -> None:
        lease = await self._require_live(handle.id)
        if not lease.get("suspended"):
            lease["suspended"] = True
            self._leases.write(lease)

    async def resume(self, handle: SandboxHandle) -> SandboxHandle:
        lease = await self._require_live(handle.id)
        if lease.get("suspended"):
            lease["suspended"] = False
            self._leases.write(lease)
        return self._handle(lease)

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        problem = lease_seconds_problem(seconds, _MAXIMUM_LEASE)
        if problem:
            raise _InvalidLease(problem)
        lease = await self._require_live(handle.id)
        lease["expires_at"] = self._clock() + seconds
        self._leases.write(lease)
        return self._handle(lease)

    async def destroy(self, handle: SandboxHandle) -> None:
        await self._remove(handle.id)

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        now = self._clock()
        return [
            self._handle(lease)
            for lease in self._leases.all()
            if lease.get("owner") == owner and float(lease["expires_at"]) > now
        ]

    async def reset_processes(self, handle: SandboxHandle) -> None:
        # Nothing a call starts outlives it: its supervisor ends the call's group, whatever left it (setsid,
        # nohup, a double fork: re-parented to the supervisor, a subreaper) when the call ends. What is left to
        # end is the calls still in flight.
        await self._require_live(handle.id)
        self._calls.stop(handle.id)

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
        for lease in self._leases.all():
            if float(lease["expires_at"]) <= now:
                await self._remove(lease["id"])
                removed.append(lease["id"])
        for entry in sorted(self.workspaces_dir.iterdir()):
            name = entry.name
            if name.startswith(".trash-"):
                await asyncio.to_thread(layout.rmtree, entry)
            elif name.startswith(".restore-"):
                # A restore in flight (maybe in another process) has its lease already; a crashed one doesn't.
                if not self._lease_path(name[len(".restore-") :]).exists():
                    await asyncio.to_thread(layout.rmtree, entry)
            elif SANDBOX_ID.fullmatch(name) and not self._lease_path(name).exists():
                await self._remove(name)
                removed.append(name)
        for entry in sorted(self.env_dir.glob("lsb-*.json")):
            if not self._lease_path(entry.name[: -len(".json")]).exists():  # a crash between env and lease removal
                entry.unlink(missing_ok=True)
        return removed

    # ------------------------------------------------------------------------------------ internals

    def _exists(self, sandbox_id: str) -> bool:
        return self._lease_path(sandbox_id).is_file() and self.workspace_path(sandbox_id).is_dir()

    async def _require_live(self, sandbox_id: str) -> dict[str, Any]:
        if not SANDBOX_ID.fullmatch(sandbox_id):
            raise SandboxGone(sandbox_id, "not a sandbox of the local provider")
        lease = self._leases.read(sandbox_id)
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
        if not SANDBOX_ID.fullmatch(sandbox_id):
            return  # never let a foreign id address a path
        workspace = self.workspace_path(sandbox_id)
        trash = self.workspaces_dir / f".trash-{sandbox_id}-{uuid.uuid4().hex[:8]}"
        # Renaming first makes the sandbox vanish at once for concurrent calls; the slow delete follows.
        try:
            os.rename(workspace, trash)
            renamed = True
        except FileNotFoundError:
            renamed = False
        self._calls.stop(sandbox_id)
        # The lease goes last, so a crash part-way leaves a lease that expiry will clean up.
        self._env_path(sandbox_id).unlink(missing_ok=True)
        self._env.pop(sandbox_id, None)
        self._lease_path(sandbox_id).unlink(missing_ok=True)
        if renamed:
            await asyncio.to_thread(layout.rmtree, trash)

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
