"""The built-in ``sandbox-agent`` workflow: runs a Workflow manifest's ``toolCalls`` in one sandbox.

It is ordinary code on top of ``ctx.sandbox``, the same mechanism code-first workflows use, so the
manifest path and the Python path share every guarantee (op ids, snapshots, recovery, finalization).
The input models here are the ones the Kubernetes resource models (``kube.models``) embed, so a
manifest is validated identically by ``dsb run`` and by ``kubectl apply``'s admission.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from durable_sandbox.engine import Context, workflow
from durable_sandbox.engine.errors import DurableError
from durable_sandbox.engine.wording import counted
from durable_sandbox.providers.contract import ToolCall, ToolResult, safe_relative_path
from durable_sandbox.providers.redaction import REDACTED
from durable_sandbox.sandboxes.journal import reserved_operation_id

NAME = "sandbox-agent"


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", serialize_by_alias=True)


PATH_MAX_LENGTH = 1024  # the CRD declares the same, so admission and `dsb run` agree

# Environment variables: what execve and every provider accept. A name with '=' or an empty name cannot
# be set at all, and a NUL ends a C string (a value would be cut short or refused by the provider).
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
NO_NUL_PATTERN = r"^[^\x00]*$"
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[str, Field(pattern=NO_NUL_PATTERN)]

# Numbers and flags are strict (`strict=True`, StrictBool), as the CRD's `type: integer/number/boolean`
# is: `timeout: true` or `snapshotEveryNCalls: "2"` is an error rather than 1 s or 2.


def manifest_path(value: str) -> str:
    """A workspace path in a manifest: relative, and no `..` segment at all (admission cannot normalise
    paths, so `dsb run` refuses what `kubectl apply` refuses)."""
    safe_relative_path(value)
    if ".." in value.replace("\\", "/").split("/"):
        raise ValueError(f"unsafe path {value!r}: '..' segments are not allowed in a manifest")
    return value


Outcome = Literal["continue", "fail"]
OnReplay = Literal["rerun", "skip", "ask"]  # journal.ON_REPLAY


class FailurePolicy(_Spec):
    """Which outcomes of a tool call fail the run. Unset fields fall back to the Workflow's policy, and
    then to ``continue``: by default every outcome is a completed call (a nonzero exit can change the
    workspace, so it is recorded, not an error)."""

    on_non_zero_exit: Outcome | None = Field(
        default=None, description="continue (the default) or fail: what a nonzero exit of a shell call does."
    )
    on_timeout: Outcome | None = Field(
        default=None,
        description="continue (the default) or fail: what a shell call that ran past its timeout (exit 124) does.",
    )

    def over(self, base: FailurePolicy | None) -> FailurePolicy:
        """This policy with its unset fields taken from ``base``."""
        if base is None:
            return self
        return FailurePolicy(
            on_non_zero_exit=self.on_non_zero_exit or base.on_non_zero_exit,
            on_timeout=self.on_timeout or base.on_timeout,
        )

    def failure(self, result: ToolResult) -> str | None:
        """Why ``result`` fails the run under this policy (None: it is a completed call)."""
        if timed_out(result):
            return "it timed out (failurePolicy.onTimeout: fail)" if self.on_timeout == "fail" else None
        if result.exit_code != 0 and self.on_non_zero_exit == "fail":
            return f"it exited with exit code {result.exit_code} (failurePolicy.onNonZeroExit: fail)"
        return None


def timed_out(result: ToolResult) -> bool:
    """Both built-in providers report a shell call stopped at its timeout as exit 124 (coreutils'
    timeout(1)) with the reason as stderr's last line."""
    lines = result.stderr.rstrip("\n").rsplit("\n", 1)
    return result.exit_code == 124 and lines[-1].startswith("Command timed out after ")


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
    failure_policy: FailurePolicy | None = Field(
        default=None,
        description="Which outcomes of this call fail the run; unset fields fall back to spec.failurePolicy.",
    )
    on_replay: OnReplay | None = Field(
        default=None,
        description="What rebuilding the sandbox after a loss does with this call once it completed: rerun "
        "(the default: execute it again, outcome checked), skip (do not execute it again; its journaled result "
        "stands and the rebuilt workspace lacks its file changes: for calls whose effect is outside the "
        "workspace, such as a git push or a deploy) or ask (wait for the signal replay:<op id>, e.g. "
        "replay:sandbox/push, answered rerun or skip). Journaled with the call when it first runs.",
    )

    @model_validator(mode="after")
    def _timeout_policy_for_shell_only(self) -> _ToolCallBase:
        if self.failure_policy is not None and self.failure_policy.on_timeout is not None and getattr(self, "type", None) != "shell":
            raise PydanticCustomError(
                "timeout_policy", "only shell calls have a timeout; remove onTimeout", {"subloc": ["failurePolicy", "onTimeout"]}
            )
        return self

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
    command: Annotated[str, Field(min_length=1, pattern=NO_NUL_PATTERN,
                                  description="The command line, run by bash in the workspace (shell calls).")]
    timeout: Annotated[
        float,
        Field(gt=0, le=86_400, strict=True, description="Seconds the command may run before it is stopped (exit 124) (shell calls)."),
    ] | None = None
    cwd: Annotated[
        str,
        Field(
            max_length=PATH_MAX_LENGTH,
            description="Working directory, relative to the workspace (default: the workspace) (shell calls).",
        ),
    ] | None = None
    env: dict[EnvName, EnvValue] = Field(
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


def check_loss_within_calls(inject_after: int | None, calls: int) -> None:
    """Loss injected after more calls than there are would silently never happen."""
    if inject_after is not None and inject_after > calls:
        raise ValueError(
            f"injectLossAfterNCalls is {inject_after}, but there {'is' if calls == 1 else 'are'} only {calls} "
            f"tool call{'' if calls == 1 else 's'}: the loss would never be injected; use at most {calls}"
        )


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

    name: EnvName = Field(description="The variable's name.")
    value: EnvValue | None = Field(default=None, description="A literal value (set exactly one of value or valueFrom).")
    value_from: EnvVarSource | None = Field(
        default=None, description="The value from a Secret (set exactly one of value or valueFrom)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env var {self.name}: set exactly one of value or valueFrom")
        return self


PROVIDER_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"
PROVIDER_DESCRIPTION = (
    "The sandbox provider: 'kubernetes' (a Pod in this namespace), 'e2b', or 'local' (subprocess workspaces; "
    "the operator accepts it only with --allow-local-provider), or one installed as a plugin."
)


class SandboxOptions(_Spec):
    """A sandbox's settings but its provider (which the Kubernetes resources may leave to the operator's default)."""

    template: str | None = Field(
        default=None, description="The provider's template for the sandbox (kubernetes: an image, or "
        "podtemplate/<name> of a PodTemplate in this namespace); the provider's default if unset."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Environment variables of the sandbox.")
    lease_seconds: Annotated[
        int,
        Field(
            ge=60,
            le=86_400,
            strict=True,
            description="How long the provider keeps the sandbox alive without renewal; the run renews it while "
            "it works, so this bounds how long a sandbox outlives a crashed worker.",
        ),
    ] = 3600


class SandboxSettings(SandboxOptions):
    """The sandbox a run works in: always a provider by name (the one its journal pins when it provisions)."""

    provider: Annotated[
        str, Field(min_length=1, pattern=PROVIDER_NAME_PATTERN, description=PROVIDER_DESCRIPTION)
    ] = "local"


class SandboxAgentInput(_Spec):
    tool_calls: Annotated[list[ToolCallSpec], Field(min_length=1, max_length=10_000)]
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    snapshot_every_n_calls: Annotated[int, Field(ge=0, le=10_000, strict=True)] = 0
    retain_latest_snapshot: StrictBool = False
    inject_loss_after_n_calls: Annotated[int, Field(ge=1, strict=True)] | None = None
    hibernate_after_seconds: Annotated[int, Field(ge=0, strict=True)] | None = None
    # "detached": the literal env values were taken out of this input (which the store keeps and `dsb
    # inspect` shows) and `AgentServices.env_values` hands them back by run id (see detach_env).
    env_values: Literal["inline", "detached"] = "inline"
    failure_policy: FailurePolicy | None = None
    # In a cluster, a Workflow's spec.sandboxRef: the Sandbox resource whose live sandbox the calls run in
    # (``sandbox`` then holds that Sandbox's settings).
    sandbox_ref: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _loss_within_calls(self) -> SandboxAgentInput:
        check_loss_within_calls(self.inject_loss_after_n_calls, len(self.tool_calls))
        return self

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
    args = spec.model_dump(exclude={"type", "operation_id", "failure_policy", "on_replay"}, exclude_none=True,
                           by_alias=False)
    if isinstance(spec, ShellCall) and not spec.env:
        args.pop("env", None)
    return ToolCall(operation_id=operation_id, type=spec.type, args=args)


def resolve_env(settings: SandboxOptions, secrets: Mapping[tuple[str, str], str] | None = None) -> dict[str, str]:
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


def _env_keys(spec: SandboxAgentInput) -> list[tuple[str, str]]:
    """(where, value) of every literal env value in ``spec``, ``where`` naming its place in the manifest."""
    found = [(f"sandbox.env.{var.name}", var.value) for var in spec.sandbox.env if var.value is not None]
    for i, call in enumerate(spec.tool_calls):
        if isinstance(call, ShellCall):
            found.extend((f"toolCalls[{i}].env.{name}", value) for name, value in call.env.items())
    return found


def _with_env(spec: SandboxAgentInput, value_of: Callable[[str, str], str], mode: str) -> SandboxAgentInput:
    env = [
        var.model_copy(update={"value": value_of(f"sandbox.env.{var.name}", var.value)}) if var.value is not None else var
        for var in spec.sandbox.env
    ]
    calls = [
        call.model_copy(update={"env": {k: value_of(f"toolCalls[{i}].env.{k}", v) for k, v in call.env.items()}})
        if isinstance(call, ShellCall) and call.env
        else call
        for i, call in enumerate(spec.tool_calls)
    ]
    sandbox = spec.sandbox.model_copy(update={"env": env})
    return spec.model_copy(update={"tool_calls": calls, "sandbox": sandbox, "env_values": mode})


def detach_env(spec: SandboxAgentInput) -> tuple[SandboxAgentInput, dict[str, str]]:
    """``spec`` with every literal env value (``sandbox.env[].value``, ``toolCalls[].env``) replaced by
    ``***``, and the values by place. The first is what a run stores; the second goes only to the
    provider, through ``AgentServices.env_values`` (`dsb run` keeps them beside the store in an
    owner-only file while the run may still need them; the operator re-reads them from the Workflow)."""
    values = dict(_env_keys(spec))
    if not values:
        return spec, {}
    return _with_env(spec, lambda _where, _value: REDACTED, "detached"), values


def attach_env(spec: SandboxAgentInput, values: Mapping[str, str]) -> SandboxAgentInput:
    missing = [where for where, _ in _env_keys(spec) if where not in values]
    if missing:
        raise ValueError(f"env values for {', '.join(missing)} are missing")
    return _with_env(spec, lambda where, _value: values[where], "inline")


class EnvValuesUnavailable(DurableError):
    """A run whose env values were kept out of the store is executed where they are not available."""


@dataclass(frozen=True)
class AgentServices:
    """What the process driving sandbox-agent runs hands them, by run id: values that are never stored (an
    extension value of the engine: ``Engine(extensions=[AgentServices(...)])``)."""

    # run id -> the literal env values kept out of its stored input (`dsb run`: runs/envfiles.py; the operator
    # re-plans the Workflow object)
    env_values: Callable[[str], Mapping[str, str] | None] | None = None
    # run id -> the Secret values its sandbox env references (the operator reads them just before it executes)
    secrets: Callable[[str], Mapping[tuple[str, str], str]] | None = None

    @staticmethod
    def of(ctx: Context) -> AgentServices:
        return ctx.operations.extensions.get(AgentServices) or AgentServices()


def _attached(ctx: Context, spec: SandboxAgentInput) -> SandboxAgentInput:
    if spec.env_values == "inline":
        return spec
    source = AgentServices.of(ctx).env_values
    values = source(ctx.run_id) if source is not None else None
    if values is None:
        raise EnvValuesUnavailable(
            f"run {ctx.run_id}: its env values are not kept in the store (they may be secrets) and this process "
            f"does not have them; continue it with `dsb run <manifest>` on the machine that started it"
        )
    try:
        return attach_env(spec, values)
    except ValueError as exc:
        raise EnvValuesUnavailable(f"run {ctx.run_id}: {exc}; continue it with `dsb run <manifest>`") from None


def _failure(where: str, policy: FailurePolicy, result: ToolResult) -> str | None:
    reason = policy.failure(result)
    return f"{where} failed the run: {reason}" if reason else None


@workflow(name=NAME, version="1")
async def sandbox_agent(ctx: Context, spec: SandboxAgentInput) -> dict[str, Any]:
    spec = _attached(ctx, spec)
    # The operator serves several namespaces from one process: the values a run may see are looked up by its
    # run id (read from its namespace's Secrets just before it executes; never journaled).
    lookup = AgentServices.of(ctx).secrets
    secrets = lookup(ctx.run_id) if lookup is not None else None
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
    if spec.sandbox_ref is not None:
        options["attach"] = spec.sandbox_ref
    async with ctx.sandbox("sandbox", provider=spec.sandbox.provider, **options) as sbx:
        total = len(spec.tool_calls)
        for index, call in enumerate(spec.tool_calls):
            # Said before the call, so a display shows the call in flight; percent counts finished calls.
            ctx.progress(f"call {index + 1}/{total}", percent=100.0 * index / total)
            policy = (call.failure_policy or FailurePolicy()).over(spec.failure_policy)
            where = f"toolCalls[{index}]"
            await sbx.call(
                to_tool_call(call, sbx.operation_id(index)),
                fails=lambda result, policy=policy, where=where: _failure(where, policy, result),
                on_replay=call.on_replay or "rerun",
            )
        ctx.progress(f"{counted(total, 'call')} done", percent=100.0)
    return sbx.result()
