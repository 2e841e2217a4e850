"""Resource models for ``Workflow`` and ``Sandbox`` (``durable-sandbox.dev/v1alpha1``).

One set of models serves ``dsb run`` (local) and the operator (cluster), so a manifest is judged the
same way in both places. The tool-call and sandbox models are the built-in ``sandbox-agent``
workflow's own input models, embedded rather than copied, so the two can never drift apart.
Loading and error reporting live in :mod:`durable_sandbox.kube.manifests` (``load_manifests`` and
``ManifestError`` are re-exported here).
"""

from __future__ import annotations

import importlib
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBool, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from durable_sandbox.workflows.sandbox_agent import (
    EnvVar,
    FailurePolicy,
    ReadFileCall,
    SandboxAgentInput,
    SandboxSettings,
    ShellCall,
    ToolCallSpec,
    WriteFileCall,
    check_loss_within_calls,
)

GROUP = "durable-sandbox.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Kubernetes object names (DNS-1123 subdomain): what kubectl would accept, so a manifest that passes
# here does not fail later at `kubectl apply`.
_DNS1123 = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_ENTRYPOINT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

# Used when the provider registry is not installed: the providers this distribution ships.
BUILTIN_PROVIDERS = frozenset({"local", "e2b"})


def available_provider_names() -> set[str]:
    """Provider names this installation can run, from the registry when it exists."""
    try:
        registry = importlib.import_module("durable_sandbox.providers.registry")
    except ImportError:
        return set(BUILTIN_PROVIDERS)
    return set(registry.available_providers())


def _dns1123(value: str) -> str:
    if len(value) > 253 or not re.match(_DNS1123, value):
        raise ValueError(
            f"{value!r} is not a valid name: use at most 253 lowercase letters, digits, '-' or '.', "
            f"starting and ending with a letter or digit"
        )
    return value


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", serialize_by_alias=True)


class _Status(BaseModel):
    # Status is written by the controller and may gain fields in newer versions; an older reader
    # must not fail on them.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", serialize_by_alias=True)


# --------------------------------------------------------------------------------------------- metadata


class ObjectMeta(BaseModel):
    """The parts of metav1.ObjectMeta we read; the API server adds more (uid, managedFields, ...)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", serialize_by_alias=True)

    name: str
    namespace: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    uid: str | None = None
    resource_version: str | None = None

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        return _dns1123(value)


# --------------------------------------------------------------------------------------------- spec


class SandboxRef(_Model):
    name: str

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        return _dns1123(value)


class RetrySpec(_Model):
    """Retry of the whole run when it fails (each retry resumes the journal: completed work is kept)."""

    max_attempts: Annotated[int, Field(ge=1, le=100, strict=True)] = 3
    initial_interval_seconds: Annotated[float, Field(ge=0, le=86_400, strict=True)] = 1.0
    backoff: Annotated[float, Field(ge=1, le=10, strict=True)] = 2.0
    max_interval_seconds: Annotated[float, Field(ge=0, le=86_400, strict=True)] = 60.0

    def interval(self, attempt: int) -> float:
        """Delay before attempt ``attempt`` (2 is the first retry)."""
        return float(min(self.initial_interval_seconds * self.backoff ** max(attempt - 2, 0), self.max_interval_seconds))


def _check_provider(name: str) -> None:
    known = available_provider_names()
    if name not in known:
        raise PydanticCustomError(
            "unknown_provider",
            "unknown sandbox provider '{provider}'; available: {known}",
            {"provider": name, "known": ", ".join(sorted(known)), "subloc": ["provider"]},
        )


class WorkflowSpec(_Model):
    tool_calls: Annotated[list[ToolCallSpec], Field(min_length=1, max_length=10_000)] | None = None
    entrypoint: str | None = None
    input: JsonValue = None
    sandbox: SandboxSettings | None = None
    sandbox_ref: SandboxRef | None = None
    snapshot_every_n_calls: Annotated[int, Field(ge=0, le=10_000, strict=True)] = 0
    retain_latest_snapshot: StrictBool = False
    inject_loss_after_n_calls: Annotated[int, Field(ge=1, strict=True)] | None = None
    retry: RetrySpec | None = None
    failure_policy: FailurePolicy | None = None
    timeout_seconds: Annotated[int, Field(ge=1, strict=True)] | None = None
    suspend: StrictBool = False
    cancel: StrictBool = False
    signals: dict[Annotated[str, Field(min_length=1)], JsonValue] = Field(default_factory=dict)
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, strict=True)] | None = None
    hibernate_after_seconds: Annotated[int, Field(ge=0, strict=True)] | None = None

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_ref(cls, value: str | None) -> str | None:
        if value is not None and not _ENTRYPOINT.match(value):
            raise ValueError(f"{value!r} is not a 'package.module:function' reference")
        return value

    @field_validator("tool_calls")
    @classmethod
    def _unique_operation_ids(
        cls, calls: list[ShellCall | WriteFileCall | ReadFileCall] | None
    ) -> list[ShellCall | WriteFileCall | ReadFileCall] | None:
        # Checked here (and not only in SandboxAgentInput) so the error points at the duplicate itself.
        seen: dict[str, int] = {}
        for i, call in enumerate(calls or []):
            if call.operation_id is None:
                continue
            if call.operation_id in seen:
                raise PydanticCustomError(
                    "duplicate_operation_id",
                    "duplicate operation id '{op}' (also used by toolCalls[{first}]); operation ids must be unique",
                    {"op": call.operation_id, "first": seen[call.operation_id], "subloc": [i, "operationId"]},
                )
            seen[call.operation_id] = i
        return calls

    @field_validator("sandbox")
    @classmethod
    def _known_provider(cls, value: SandboxSettings | None) -> SandboxSettings | None:
        if value is not None:
            _check_provider(value.provider)
        return value

    @model_validator(mode="after")
    def _one_program(self) -> WorkflowSpec:
        if (self.tool_calls is None) == (self.entrypoint is None):
            which = "both are set" if self.tool_calls is not None else "neither is set"
            raise ValueError(f"set exactly one of toolCalls or entrypoint ({which})")
        if self.input is not None and self.entrypoint is None:
            raise ValueError("input is the entrypoint's argument; it needs entrypoint (toolCalls take no input)")
        if self.sandbox is not None and self.sandbox_ref is not None:
            raise ValueError("set at most one of sandbox or sandboxRef")
        return self

    @model_validator(mode="after")
    def _loss_within_calls(self) -> WorkflowSpec:
        if self.tool_calls is not None:
            try:
                check_loss_within_calls(self.inject_loss_after_n_calls, len(self.tool_calls))
            except ValueError as exc:
                raise PydanticCustomError(
                    "loss_after_calls", "{reason}", {"reason": str(exc), "subloc": ["injectLossAfterNCalls"]}
                ) from None
        return self


# A Workflow's inline `sandbox` settings plus what only a standalone Sandbox has.
class SandboxResourceSpec(SandboxSettings):
    # A standalone Sandbox renews its own lease, so a short one only makes loss detection sooner.
    lease_seconds: Annotated[int, Field(ge=5, le=86_400, strict=True)] = 3600
    suspend: StrictBool = False
    from_snapshot: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        known = available_provider_names()
        if value not in known:
            raise ValueError(f"unknown sandbox provider {value!r}; available: {', '.join(sorted(known))}")
        return value

    def settings(self) -> SandboxSettings:
        # A Workflow's own lease is at least a minute; a shorter Sandbox lease is the Sandbox's to renew.
        return SandboxSettings(
            provider=self.provider, template=self.template, env=list(self.env), lease_seconds=max(60, self.lease_seconds)
        )


# --------------------------------------------------------------------------------------------- status


class Condition(_Status):
    """metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class CallsStatus(_Status):
    completed: int = 0
    total: int = 0


class PendingCallbackStatus(_Status):
    id: str
    payload: JsonValue = None


class OperationSummary(_Status):
    op_id: str
    kind: str
    name: str
    status: str
    attempt: int = 1
    exit_code: int | None = None
    error: str | None = None
    finished_at: str | None = None


class JournalRef(_Status):
    """One owned object holding a chunk of the journal."""

    name: str
    first_seq: int | None = None
    last_seq: int | None = None
    count: int = 0


class SandboxStatusRef(_Status):
    name: str | None = None
    provider: str | None = None
    provider_id: str | None = None


class CurrentCall(_Status):
    """The operation in flight (a tool call or a step) while the run is Running."""

    op_id: str
    kind: str
    name: str
    index: int | None = None


class StatusError(_Status):
    """Why the run failed or was cancelled (the journal has every attempt's error)."""

    type: str
    message: str


class WorkflowStatus(_Status):
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    phase: str | None = None
    run_id: str | None = None
    calls: CallsStatus | None = None
    current_call: CurrentCall | None = None
    attempt: int | None = None  # the run attempt (spec.retry), 1 for the first
    wake_at: str | None = None  # when a waiting run's durable timer is due (RFC 3339)
    error: StatusError | None = None
    pending_callbacks: list[PendingCallbackStatus] = Field(default_factory=list)
    recent_operations: list[OperationSummary] = Field(default_factory=list)
    journal: list[JournalRef] = Field(default_factory=list)
    sandbox: SandboxStatusRef | None = None
    latest_snapshot: str | None = None
    recovery_count: int = 0
    result: JsonValue = None
    result_ref: str | None = None  # where a result too large for status is kept
    started_at: str | None = None
    finished_at: str | None = None
    # kopf's own progress and diff-base storage (the operator keeps it here, not in annotations on users' objects).
    kopf: dict[str, Any] | None = None


class SandboxOperation(_Status):
    """A provider operation recorded before it starts (intent), so a restart finishes it exactly once."""

    id: str
    kind: Literal["provision", "restore", "snapshot", "destroy"]
    snapshot_id: str | None = None  # restore: the source; destroy: the snapshot just recorded


class SandboxResourceStatus(_Status):
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    phase: str | None = None  # printer convenience, as on Workflow
    provider_id: str | None = None
    # The provider's handle metadata (never secrets), enough to reach the sandbox again after a restart.
    handle: dict[str, Any] | None = None
    capabilities: dict[str, Any] | None = None
    lease_expires_at: str | None = None
    snapshots: list[str] = Field(default_factory=list)  # owned by this Sandbox, oldest first
    operation: SandboxOperation | None = None
    operation_count: int = 0  # numbers operation ids
    holder: str | None = None  # the Workflow whose run uses the sandbox now
    # kopf's own progress and diff-base storage (as on Workflow).
    kopf: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------------- resources


class WorkflowResource(_Model):
    api_version: Literal["durable-sandbox.dev/v1alpha1"] = "durable-sandbox.dev/v1alpha1"
    kind: Literal["Workflow"] = "Workflow"
    metadata: ObjectMeta
    spec: WorkflowSpec
    status: WorkflowStatus | None = None


class SandboxResource(_Model):
    api_version: Literal["durable-sandbox.dev/v1alpha1"] = "durable-sandbox.dev/v1alpha1"
    kind: Literal["Sandbox"] = "Sandbox"
    metadata: ObjectMeta
    spec: SandboxResourceSpec = Field(default_factory=SandboxResourceSpec)
    status: SandboxResourceStatus | None = None


Resource = WorkflowResource | SandboxResource
KINDS: dict[str, type[WorkflowResource] | type[SandboxResource]] = {
    "Workflow": WorkflowResource,
    "Sandbox": SandboxResource,
}


def to_sandbox_agent_input(spec: WorkflowSpec, sandbox: SandboxSettings | None = None) -> SandboxAgentInput:
    """The ``sandbox-agent`` input for a toolCalls Workflow. ``sandbox`` overrides ``spec.sandbox``
    (the caller resolves ``sandboxRef`` to settings)."""
    if spec.tool_calls is None:
        raise ValueError("this Workflow has an entrypoint, not toolCalls; it does not run sandbox-agent")
    return SandboxAgentInput(
        tool_calls=list(spec.tool_calls),
        sandbox=sandbox or spec.sandbox or SandboxSettings(),
        snapshot_every_n_calls=spec.snapshot_every_n_calls,
        retain_latest_snapshot=spec.retain_latest_snapshot,
        inject_loss_after_n_calls=spec.inject_loss_after_n_calls,
        hibernate_after_seconds=spec.hibernate_after_seconds,
        failure_policy=spec.failure_policy,
    )


def __getattr__(name: str) -> Any:
    # Lazy re-export: manifests imports this module, so an eager import here would be circular.
    if name in ("ManifestError", "load_manifests"):
        from durable_sandbox.kube import manifests

        return getattr(manifests, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "VERSION",
    "CallsStatus",
    "Condition",
    "EnvVar",
    "FailurePolicy",
    "JournalRef",
    "ObjectMeta",
    "OperationSummary",
    "PendingCallbackStatus",
    "ReadFileCall",
    "Resource",
    "RetrySpec",
    "SandboxRef",
    "SandboxResource",
    "SandboxResourceSpec",
    "SandboxResourceStatus",
    "SandboxSettings",
    "SandboxStatusRef",
    "ShellCall",
    "ToolCallSpec",
    "WorkflowResource",
    "WorkflowSpec",
    "WorkflowStatus",
    "WriteFileCall",
    "available_provider_names",
    "to_sandbox_agent_input",
]
