"""``dirsnap``: directory workspaces, directory-copy snapshots. Development only: not an isolation boundary."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from durable_sandbox.providers.contract import (
    TOOL_TYPES,
    Capability,
    ProviderCapabilities,
    ProvisionError,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    ToolCall,
    ToolResult,
    file_not_found_result,
    safe_relative_path,
    unsupported_tool_result,
    wrote_file_result,
)

MAXIMUM_LEASE_SECONDS = 86_400


@dataclass
class _Box:
    owner: str | None
    expires_at: float
    env: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets: memory only


class DirSnapProvider(SandboxProvider):
    name = "dirsnap"

    def __init__(self, root: Path | str | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="dirsnap-"))
        self._clock = clock
        self._boxes: dict[str, _Box] = {}
        (self.root / "sandboxes").mkdir(parents=True, exist_ok=True)
        (self.root / "snapshots").mkdir(parents=True, exist_ok=True)

    def capabilities(self) -> ProviderCapabilities:
        # Only what this class implements. The base class makes every other lifecycle call raise
        # UnsupportedCapability before doing anything.
        return ProviderCapabilities(
            supported=frozenset({Capability.SNAPSHOT, Capability.SNAPSHOT_DELETION,
                                 Capability.SNAPSHOT_RECONCILIATION, Capability.RESTORE,
                                 Capability.LEASE_RECONCILIATION}),
            maximum_lease_seconds=MAXIMUM_LEASE_SECONDS,
        )

    def workspace(self, sandbox_id: str) -> Path:
        return self.root / "sandboxes" / sandbox_id

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        return self.root / "snapshots" / snapshot_id

    def _live(self, handle: SandboxHandle) -> tuple[_Box, Path]:
        box = self._boxes.get(handle.id)
        workspace = self.workspace(handle.id)
        if box is None or not workspace.is_dir():
            raise SandboxGone(handle.id, "no such workspace")
        if box.expires_at <= self._clock():
            self._discard(handle.id)
            raise SandboxGone(handle.id, "its lease expired")
        return box, workspace

    def _discard(self, sandbox_id: str) -> None:
        self._boxes.pop(sandbox_id, None)
        shutil.rmtree(self.workspace(sandbox_id), ignore_errors=True)

    def _new(self, spec: SandboxSpec, lease_seconds: int, source: Path | None) -> SandboxHandle:
        if not 1 <= lease_seconds <= MAXIMUM_LEASE_SECONDS:
            raise ProvisionError(f"lease_seconds must be in [1, {MAXIMUM_LEASE_SECONDS}]", retryable=False)
        sandbox_id = "ds-" + uuid.uuid4().hex[:16]
        if source is None:
            self.workspace(sandbox_id).mkdir()
        else:
            shutil.copytree(source, self.workspace(sandbox_id), symlinks=True)
        expires_at = self._clock() + lease_seconds
        self._boxes[sandbox_id] = _Box(spec.owner, expires_at, dict(spec.env))
        return SandboxHandle(id=sandbox_id, provider=self.name, metadata={"owner": spec.owner},
                             lease_expires_at=expires_at)

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        return self._new(spec, lease_seconds, None)

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        source = self._snapshot_dir(snapshot_id)
        if not source.is_dir():
            raise ProvisionError(f"snapshot {snapshot_id} does not exist", retryable=False)
        return self._new(spec, lease_seconds, source)

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        _, workspace = self._live(handle)
        # Reconciliation: the id is derived from the operation id, so a retry finds the first snapshot.
        snapshot_id = "dsnap-" + hashlib.sha256(operation_id.encode()).hexdigest()[:24]
        target = self._snapshot_dir(snapshot_id)
        if not target.exists():
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(workspace, partial, symlinks=True)
            partial.rename(target)  # atomic: a crash never leaves a half-copied snapshot under the real id
        return snapshot_id

    async def delete_snapshot(self, snapshot_id: str) -> None:
        shutil.rmtree(self._snapshot_dir(snapshot_id), ignore_errors=True)

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        box, _ = self._live(handle)
        box.expires_at = self._clock() + seconds
        return handle.model_copy(update={"lease_expires_at": box.expires_at})

    async def destroy(self, handle: SandboxHandle) -> None:
        self._discard(handle.id)

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        now = self._clock()
        return [
            SandboxHandle(id=sid, provider=self.name, metadata={"owner": owner}, lease_expires_at=box.expires_at)
            for sid, box in self._boxes.items()
            if box.owner == owner and box.expires_at > now and self.workspace(sid).is_dir()
        ]

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        if call.type not in TOOL_TYPES:
            return unsupported_tool_result(call.type)
        box, workspace = self._live(handle)
        try:
            if call.type == "shell":
                return await self._shell(box, workspace, call)
            path = str(call.args.get("path", ""))
            target = workspace / safe_relative_path(path)
        except ValueError as exc:
            return ToolResult(exit_code=1, stderr=str(exc))
        if call.type == "write_file":
            data = str(call.args.get("contents", "")).encode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            return wrote_file_result(path, len(data))
        if not target.is_file():
            return file_not_found_result(path)
        return ToolResult(exit_code=0, stdout=target.read_bytes().decode("utf-8", errors="replace"))

    async def _shell(self, box: _Box, workspace: Path, call: ToolCall) -> ToolResult:
        cwd = workspace / safe_relative_path(call.args["cwd"]) if call.args.get("cwd") else workspace
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workspace), **box.env,
               **call.args.get("env", {})}
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", str(call.args.get("command", "")), cwd=cwd, env=env, start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        timeout = call.args.get("timeout")
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return ToolResult(exit_code=124, stderr=f"Command timed out after {timeout:g} seconds")
        assert process.returncode is not None
        return ToolResult(exit_code=process.returncode, stdout=out.decode("utf-8", errors="replace"),
                          stderr=err.decode("utf-8", errors="replace"))
