"""The built-in ``sandbox-agent`` workflow: runs a Workflow manifest's ``toolCalls`` in one sandbox.

It is ordinary code on top of ``ctx.sandbox``, the same mechanism code-first workflows use, so the
manifest path and the Python path share every guarantee (op ids, snapshots, recovery, finalization).
The input models here are the ones the Kubernetes resource models (``kube.models``) embed, so a
manifest is validated identically by ``dsb run`` and by ``kubectl apply``'s admission.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from durable_sandbox.engine import Context, workflow
from durable_sandbox.providers.contract import ToolCall, safe_relative_path
from durable_sandbox.sandboxes.session import reserved_operation_id

NAME = "sandbox-agent"


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", serialize_by_alias=True)


PATH_MAX_LENGTH = 1024  # the CRD declares the same, so admission and `dsb run` agree


def manifest_path(value: str) -> str:
    """A workspace path in a manifest: relative, and no `..` segment at all (admission cannot normalise
    paths, so `dsb run` refuses what `kubectl apply` refuses)."""
    safe_relative_path(value)
    if ".." in value.replace("\\", "/").split("/"):
        raise ValueError(f"unsafe path {value!r}: '..' segments are not allowed in a manifest")
    return value


class _ToolCallBase(_Spec):
    operation_id: Annotated[
        str,
        Field(
            min_length=1,
            max_length=253,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
            description="A stable id for this call in the journal (default: derived from its position). Unique across "
            "toolCalls; keeping ids stable when editing a manifest keeps the history matched by id.",
        ),
    ] | None = None

    @field_validator("operation_id")
    @classmethod
    def _not_reserved(cls, value: str | None) -> str | None:
        if value is not None and reserved_operation_id(value):
            raise ValueError(
                f"{value!r} is reserved for the sandbox session's own records "
                f"(ids starting with provision, finalize, snapshot, restore, destroy or inject_loss)"
            )
        return value


_PATH = "A file, relative to the sandbox workspace (no leading '/', no '..' segments)."


class ShellCall(_ToolCallBase):
    """Run a shell command in the sandbox. A nonzero exit is a completed call (recorded with its exit code)."""

    type: Literal["shell"]
    command: Annotated[str, Field(min_length=1, description="The command line, run by bash in the workspace (shell calls).")]
    timeout: Annotated[
        float,
        Field(gt=0, le=86_400, description="Seconds the command may run before it is stopped (exit 124) (shell calls)."),
    ] | None = None
    cwd: Annotated[
        str,
        Field(
            max_length=PATH_MAX_LENGTH,
            description="Working directory, relative to the workspace (default: the workspace) (shell calls).",
        ),
    ] | None = None
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables for this command only (shell calls)."
    )

    @field_validator("cwd")
    @classmethod
    def _safe_cwd(cls, value: str | None) -> str | None:
        if value is not None:
            manifest_path(value)
        return value


class WriteFileCall(_ToolCallBase):
    """Write a file in the sandbox workspace (parent directories are created)."""

    type: Literal["write_file"]
    path: Annotated[str, Field(max_length=PATH_MAX_LENGTH, description=_PATH)]
    contents: str = Field(description="The text to write, as UTF-8 (write_file calls).")

    @field_validator("path")
    @classmethod
    def _safe_path(cls, value: str) -> str:
        manifest_path(value)
        return value


class ReadFileCall(_ToolCallBase):
    """Read a file of the sandbox workspace; its contents are the call's result."""

    type: Literal["read_file"]
    path: Annotated[str, Field(max_length=PATH_MAX_LENGTH, description=_PATH)]

    @field_validator("path")
    @classmethod
    def _safe_path(cls, value: str) -> str:
        manifest_path(value)
        return value


ToolCallSpec = Annotated[ShellCall | WriteFileCall | ReadFileCall, Field(discriminator="type")]


class SecretKeyRef(_Spec):
    """A key of a Secret in the Workflow's namespace."""

    name: Annotated[str, Field(min_length=1, description="The Secret's name.")]
    key: Annotated[str, Field(min_length=1, description="The key within the Secret's data.")]


class EnvVarSource(_Spec):
    """Where an environment variable's value comes from."""

    secret_key_ref: SecretKeyRef = Field(
        description="A key of a Secret in the Workflow's namespace. The operator reads it when it provisions "
        "the sandbox; the value is never stored in the journal, status, events or logs."
    )


class EnvVar(_Spec):
    """An environment variable of the sandbox: a literal value or a reference to a Secret."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="The variable's name.")]
    value: str | None = Field(default=None, description="A literal value (set exactly one of value or valueFrom).")
    value_from: EnvVarSource | None = Field(
        default=None, description="The value from a Secret (set exactly one of value or valueFrom)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env var {self.name}: set exactly one of value or valueFrom")
        return self


class SandboxSettings(_Spec):
    """The sandbox a run works in."""

    provider: Annotated[
        str,
        Field(
            min_length=1,
            pattern=r"^[a-z0-9][a-z0-9_.-]*$",
            description="The sandbox provider: 'e2b', or 'local' (subprocess workspaces; the operator accepts it "
            "only with --allow-local-provider), or one installed as a plugin.",
        ),
    ] = "local"
    template: str | None = Field(
        default=None, description="The provider's template (image) for the sandbox; the provider's default if unset."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Environment variables of the sandbox.")
    lease_seconds: Annotated[
        int,
        Field(
            ge=60,
            le=86_400,
            description="How long the provider keeps the sandbox alive without renewal; the run renews it while "
            "it works, so this bounds how long a sandbox outlives a crashed worker.",
        ),
    ] = 3600


class SandboxAgentInput(_Spec):
    tool_calls: Annotated[list[ToolCallSpec], Field(min_length=1, max_length=10_000)]
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    snapshot_every_n_calls: Annotated[int, Field(ge=0, le=10_000)] = 0
    retain_latest_snapshot: bool = False
    inject_loss_after_n_calls: Annotated[int, Field(ge=1)] | None = None
    hibernate_after_seconds: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _unique_operation_ids(self) -> SandboxAgentInput:
        seen: dict[str, int] = {}
        for i, call in enumerate(self.tool_calls):
            if call.operation_id is None:
                continue
            if call.operation_id in seen:
                raise ValueError(
                    f"toolCalls[{i}].operationId {call.operation_id!r} duplicates toolCalls[{seen[call.operation_id]}]; "
                    f"operation ids must be unique"
                )
            seen[call.operation_id] = i
        return self


def to_tool_call(spec: ShellCall | WriteFileCall | ReadFileCall, operation_id: str) -> ToolCall:
    args = spec.model_dump(exclude={"type", "operation_id"}, exclude_none=True, by_alias=False)
    if isinstance(spec, ShellCall) and not spec.env:
        args.pop("env", None)
    return ToolCall(operation_id=operation_id, type=spec.type, args=args)


def resolve_env(settings: SandboxSettings, secrets: dict[tuple[str, str], str] | None = None) -> dict[str, str]:
    """Literal values plus secret references resolved by the caller (the operator reads Secrets)."""
    env: dict[str, str] = {}
    for var in settings.env:
        if var.value is not None:
            env[var.name] = var.value
        else:
            assert var.value_from is not None
            ref = var.value_from.secret_key_ref
            if secrets is None or (ref.name, ref.key) not in secrets:
                raise ValueError(
                    f"env var {var.name} references Secret {ref.name}/{ref.key}, which is not available here; "
                    f"secret references resolve only in the cluster (or set the value directly for local runs)"
                )
            env[var.name] = secrets[(ref.name, ref.key)]
    return env


@workflow(name=NAME, version="1")
async def sandbox_agent(ctx: Context, spec: SandboxAgentInput) -> dict[str, Any]:
    secrets = ctx.operations.services.get("secrets")
    options: dict[str, Any] = {
        "template": spec.sandbox.template,
        "env": resolve_env(spec.sandbox, secrets),
        "lease_seconds": spec.sandbox.lease_seconds,
        "snapshot_every": spec.snapshot_every_n_calls,
        "retain_latest_snapshot": spec.retain_latest_snapshot,
        "inject_loss_after": spec.inject_loss_after_n_calls,
        "operation_ids": [c.operation_id for c in spec.tool_calls],
    }
    if spec.hibernate_after_seconds is not None:
        options["hibernate_after"] = spec.hibernate_after_seconds
    async with ctx.sandbox("sandbox", provider=spec.sandbox.provider, **options) as sbx:
        for index, call in enumerate(spec.tool_calls):
            await sbx.call(to_tool_call(call, sbx.operation_id(index)))
            ctx.progress(f"call {index + 1}/{len(spec.tool_calls)}", percent=100.0 * (index + 1) / len(spec.tool_calls))
    return sbx.result()
