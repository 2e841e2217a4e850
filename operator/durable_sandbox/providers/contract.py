"""Sandbox provider contract v1.

Every provider subclasses :class:`SandboxProvider`. A lifecycle method that a provider does not support
raises :class:`UnsupportedCapability` *before doing anything*; it never succeeds silently, because a
caller that believes a snapshot was taken (or a sandbox suspended) would build on something that does
not exist.

This module imports nothing else of the package: providers are the bottom layer.
"""

from __future__ import annotations

import enum
import hashlib
import posixpath
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from durable_sandbox.providers.output import cap_text

CONTRACT_VERSION = 1


class Capability(enum.StrEnum):
    SNAPSHOT = "snapshot"
    SNAPSHOT_DELETION = "snapshot_deletion"
    SNAPSHOT_RECONCILIATION = "snapshot_reconciliation"
    RESTORE = "restore"
    SUSPEND = "suspend"
    RESUME = "resume"
    OPERATION_DEDUPLICATION = "operation_deduplication"
    LEASE_RECONCILIATION = "lease_reconciliation"
    LOSS_INJECTION = "loss_injection"
    # Lists every sandbox and every snapshot of an installation (inventory_sandboxes/_snapshots): orphan sweeps.
    INVENTORY = "inventory"
    # Ends every process in a live sandbox but what keeps it alive (reset_processes): a shared sandbox changing
    # hands, so that nothing the previous holder's code left running sees the next holder's calls.
    PROCESS_RESET = "process_reset"
    # Hands a shell call's stdout and stderr to the caller's sink as they come, before the call returns
    # (providers/streaming.py); without it the output is given only in the result.
    OUTPUT_STREAMING = "output_streaming"
    # Copies a snapshot under an id of its own (copy_snapshot): a fork restores from its own copy of its source's
    # snapshot, so each snapshot object has one owner and is deleted exactly once, by it (sandboxes/fork.py).
    SNAPSHOT_COPY = "snapshot_copy"


DeliveryGuarantee = Literal["at_least_once_effects", "deduplicated_operations"]
TOOL_TYPES: tuple[str, ...] = ("shell", "write_file", "read_file")

# Labels of a SandboxSpec that providers with the inventory capability keep on the sandbox *and* on every
# snapshot taken of it: which installation (operator deployment) made it, and whether the session may hand
# its newest snapshot over to the caller (such snapshots are never swept: their owner may be the user).
INSTALLATION_LABEL = "durable-sandbox.dev/installation"
RETAIN_LABEL = "durable-sandbox.dev/retain-snapshot"

# A SandboxHandle's metadata key: the RuntimeClass the sandbox runs under (gVisor, Kata...), from what the cluster
# made rather than what was asked for, for providers that know it. Shown in the Workflow's and Sandbox's status.
RUNTIME_CLASS_KEY = "runtimeClassName"


def tag_key(value: str) -> str:
    """A short stable digest of an installation id or an owner tag. A provider that can keep only a name
    with a snapshot (e2b) keeps these; inventories report owners and installations as keys, so an orphan
    sweep compares ``tag_key(x)`` whichever provider it asks."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------- errors


class ProviderError(Exception):
    """A transient provider failure: the caller retries with backoff."""

    retryable: bool = True


class RateLimited(ProviderError):
    """The provider refused the request for load (HTTP 429), not for anything wrong with it, and it was
    not processed. Callers slow down instead of failing: wait ``retry_after`` seconds (the provider's
    Retry-After, when it said one) or back off, then try again, without counting it as a failed attempt."""

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SandboxGone(ProviderError):
    """The sandbox no longer exists (expired, killed, lost). Triggers recovery, not a retry."""

    retryable = False

    def __init__(self, sandbox_id: str, detail: str = "") -> None:
        self.sandbox_id = sandbox_id
        msg = f"Sandbox {sandbox_id} is gone"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class ProvisionError(ProviderError):
    """Provisioning failed; ``retryable`` says whether trying again can help (quota, 5xx) or not (bad template)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class UnsupportedCapability(ProviderError):
    retryable = False

    def __init__(self, provider: str, capability: Capability | str) -> None:
        cap = capability.value if isinstance(capability, Capability) else capability
        self.provider = provider
        self.capability = cap
        super().__init__(
            f"Sandbox provider [{provider}] does not support [{cap}]; the operation was not attempted."
        )


class ConfigurationError(ProviderError):
    """The provider is misconfigured (missing API key, bad URL). Not retryable: fix the configuration."""

    retryable = False


# --------------------------------------------------------------------------------------------- values


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProviderCapabilities(_Frozen):
    supported: frozenset[Capability] = frozenset()
    delivery_guarantee: DeliveryGuarantee = "at_least_once_effects"
    idempotent_destroy: bool = True
    maximum_lease_seconds: int = 86_400
    tool_types: tuple[str, ...] = TOOL_TYPES

    def supports(self, capability: Capability) -> bool:
        return capability in self.supported

    def consistency_problems(self) -> list[str]:
        """Declarations that contradict each other (checked by the contract kit and the registry)."""
        problems = []
        dedup = Capability.OPERATION_DEDUPLICATION in self.supported
        if dedup != (self.delivery_guarantee == "deduplicated_operations"):
            problems.append(
                "delivery_guarantee must be 'deduplicated_operations' exactly when operation_deduplication is supported"
            )
        if Capability.SNAPSHOT_RECONCILIATION in self.supported and Capability.SNAPSHOT not in self.supported:
            problems.append("snapshot_reconciliation requires snapshot")
        if Capability.RESTORE in self.supported and Capability.SNAPSHOT not in self.supported:
            problems.append("restore requires snapshot")
        if Capability.INVENTORY in self.supported and Capability.LEASE_RECONCILIATION not in self.supported:
            problems.append("inventory requires lease_reconciliation")
        if self.maximum_lease_seconds <= 0:
            problems.append("maximum_lease_seconds must be positive")
        return problems


class SandboxSpec(_Frozen):
    template: str | None = None
    env: dict[str, str] = Field(default_factory=dict, repr=False)  # may hold secrets: never logged
    owner: str | None = None  # owner tag for orphan sweeps (cluster id / run id)
    labels: dict[str, str] = Field(default_factory=dict)  # non-secret metadata (run id, workflow, ...)
    # Stable id of the provision/restore operation this spec is for (the same on every retry of it).
    # Providers whose create API deduplicates (e2b: Idempotency-Key) use it so that a create retried
    # after a lost answer yields one sandbox; others ignore it. Never put in handles or sandbox metadata.
    operation_id: str | None = None


class SandboxHandle(_Frozen):
    """What a provider hands back: enough to reach the sandbox again. Never holds secrets.

    ``metadata["labels"]`` carries the spec's labels (on handles from provision, restore and
    list_sandboxes): sessions use them to find a sandbox made just before a crash and never recorded.
    """

    id: str
    provider: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    lease_expires_at: float | None = None


class ToolCall(_Frozen):
    operation_id: str
    type: str
    args: dict[str, Any] = Field(default_factory=dict)


class ToolResult(_Frozen):
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    # The full size in bytes of a stream that was truncated (see providers/output.py); None when whole.
    stdout_size: int | None = None
    stderr_size: int | None = None

    @property
    def truncated(self) -> bool:
        return self.stdout_size is not None or self.stderr_size is not None

    def capped(self) -> ToolResult:
        """This result with stdout and stderr cut to their first and last 64 KiB (sizes recorded)."""
        out, out_size = cap_text(self.stdout)
        err, err_size = cap_text(self.stderr)
        if out_size is None and err_size is None:
            return self
        return self.model_copy(update={
            "stdout": out, "stderr": err,
            "stdout_size": out_size if out_size is not None else self.stdout_size,
            "stderr_size": err_size if err_size is not None else self.stderr_size,
        })

    @property
    def outcome(self) -> tuple[int, str, str]:
        return (self.exit_code, self.stdout, self.stderr)


class SnapshotEntry(_Frozen):
    """A snapshot as an inventory lists it: what it was taken of, as :func:`tag_key` digests."""

    id: str
    provider: str
    installation_key: str  # tag_key of the INSTALLATION_LABEL of the sandbox it was taken of
    owner_key: str | None = None  # tag_key of that sandbox's owner tag (None: it had none)
    retained: bool = False  # that sandbox had RETAIN_LABEL: the snapshot may belong to the user now


def unsupported_tool_result(tool_type: str) -> ToolResult:
    return ToolResult(exit_code=1, stdout="", stderr=f"Unsupported tool type: {tool_type}")


def file_not_found_result(path: str) -> ToolResult:
    return ToolResult(exit_code=1, stdout="", stderr=f"File not found: {path}")


def wrote_file_result(path: str, size: int) -> ToolResult:
    return ToolResult(exit_code=0, stdout=f"wrote {path} {size} bytes", stderr="")


def safe_relative_path(path: str) -> str:
    """Normalise a workspace path; refuse absolute paths and any path that climbs out of the workspace."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"unsafe path {path!r}: must be a non-empty relative path")
    if path.startswith("/") or path.startswith("\\"):
        raise ValueError(f"unsafe path {path!r}: absolute paths are not allowed; use a path relative to the workspace")
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../") or norm == ".":
        raise ValueError(f"unsafe path {path!r}: it leaves the workspace")
    return norm


# --------------------------------------------------------------------------------------------- contract


class SandboxProvider:
    """Base class for sandbox providers (contract v1).

    Subclasses set ``name``, override :meth:`capabilities`, and override the lifecycle methods they
    support. The defaults here raise :class:`UnsupportedCapability` for optional capabilities, so a
    provider that forgets to implement one fails loudly instead of pretending.
    """

    name: ClassVar[str] = "abstract"
    contract_version: ClassVar[int] = CONTRACT_VERSION

    def capabilities(self) -> ProviderCapabilities:
        return ProviderCapabilities()

    @classmethod
    def configuration_problems(cls, environ: Mapping[str, str]) -> list[str]:
        """What is missing or malformed in the configuration this provider reads from ``environ``, one
        line each (never echoing a secret). Checked before a run is created, so a run is never started
        against a provider that cannot be constructed. The default: nothing is required."""
        return []

    def require(self, capability: Capability) -> None:
        if not self.capabilities().supports(capability):
            raise UnsupportedCapability(self.name, capability)

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        raise NotImplementedError

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        raise NotImplementedError

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        raise UnsupportedCapability(self.name, Capability.SNAPSHOT)

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        raise UnsupportedCapability(self.name, Capability.RESTORE)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        raise UnsupportedCapability(self.name, Capability.SNAPSHOT_DELETION)

    async def copy_snapshot(self, snapshot_id: str, *, operation_id: str) -> str:
        """A copy of snapshot ``snapshot_id`` under an id of its own, derived from ``operation_id`` (a retried copy
        finds the first one); deleting either never affects the other. ProvisionError if the snapshot is gone."""
        raise UnsupportedCapability(self.name, Capability.SNAPSHOT_COPY)

    async def suspend(self, handle: SandboxHandle) -> None:
        raise UnsupportedCapability(self.name, Capability.SUSPEND)

    async def resume(self, handle: SandboxHandle) -> SandboxHandle:
        raise UnsupportedCapability(self.name, Capability.RESUME)

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        raise NotImplementedError

    async def destroy(self, handle: SandboxHandle) -> None:
        raise NotImplementedError

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        raise UnsupportedCapability(self.name, Capability.LEASE_RECONCILIATION)

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        """Every sandbox whose spec had ``labels[INSTALLATION_LABEL] == installation``, whatever its owner
        (running or suspended), with ``metadata["owner"]`` and ``metadata["labels"]``."""
        raise UnsupportedCapability(self.name, Capability.INVENTORY)

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        """Every snapshot taken of a sandbox labelled with ``installation`` (see :class:`SnapshotEntry`)."""
        raise UnsupportedCapability(self.name, Capability.INVENTORY)

    async def reset_processes(self, handle: SandboxHandle) -> None:
        """End every process in the live sandbox but what keeps it alive (its files stay): whatever earlier calls
        left running (``setsid``, ``nohup``, a double fork, ``env -i``) is gone before the next call starts."""
        raise UnsupportedCapability(self.name, Capability.PROCESS_RESET)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        """Destroy the sandbox behind the caller's back, as a real loss would (testing aid)."""
        raise UnsupportedCapability(self.name, Capability.LOSS_INJECTION)

    async def aclose(self) -> None:
        """Release client resources (HTTP pools). Idempotent."""
