"""Resource models for ``Workflow`` and ``Sandbox`` (``durable-sandbox.dev/v1alpha1``).

One set of models serves ``dsb run`` (local) and the operator (cluster), so a manifest is judged the
same way in both places. The tool-call and sandbox models are the built-in ``sandbox-agent``
workflow's own input models, embedded rather than copied, so the two can never drift apart.
Loading and error reporting live in :mod:`durable_sandbox.kube.spec.manifests` (``load_manifests`` and
``ManifestError`` are re-exported here).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBool, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from durable_sandbox.engine.driver import RetrySchedule
from durable_sandbox.kube.spec.conditions import SANDBOX_CONDITIONS, WORKFLOW_CONDITIONS
from durable_sandbox.sandboxes.journal import answer_problem
from durable_sandbox.workflows.sandbox_agent import (
    PROVIDER_DESCRIPTION,
    PROVIDER_NAME_PATTERN,
    EnvVar,
    FailurePolicy,
    ReadFileCall,
    SandboxAgentInput,
    SandboxOptions,
    SandboxSettings,
    ShellCall,
    ToolCallSpec,
    WriteFileCall,
    check_loss_within_calls,
)

# Kubernetes object names (DNS-1123 subdomain): what kubectl would accept, so a manifest that passes
# here does not fail later at `kubectl apply`.
_DNS1123 = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_ENTRYPOINT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

# Bounds on spec.signals (JSON bytes): one value, and all of them together.
SIGNAL_MAX_BYTES = 64 * 1024
SIGNALS_MAX_BYTES = 256 * 1024

# Used when the provider registry is not installed: the providers this distribution ships.
BUILTIN_PROVIDERS = frozenset({"local", "e2b", "kubernetes", "agent-sandbox"})


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
    """A Sandbox resource in the same namespace."""

    name: str = Field(description="The Sandbox's name.")

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        return _dns1123(value)


WORKER_QUEUE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
_WORKER_QUEUE = re.compile(WORKER_QUEUE_PATTERN)


class WorkerSpec(_Model):
    """Execute the run in the team's own workers (``dsb worker --kube --queue QUEUE`` in this namespace), not
    in the operator: the operator admits it, reports its status and cleans up after it."""

    queue: str = Field(description="The queue the workers serving this run listen on (a DNS label of at most 40 "
                       "characters): `dsb worker --kube --queue QUEUE` in the Workflow's namespace.")

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        if not _WORKER_QUEUE.match(value):
            raise ValueError(f"{value!r} is not a queue name (lowercase letters, digits and '-', at most 40 "
                             "characters, starting and ending with a letter or digit)")
        return value


class RetrySpec(_Model):
    """Retry of the whole run when it fails (each retry resumes the journal: completed work is kept)."""

    max_attempts: Annotated[int, Field(ge=1, le=100, strict=True, description="Attempts in all, the first included.")] = 3
    initial_interval_seconds: Annotated[
        float, Field(ge=0, le=86_400, strict=True, description="Seconds before the first retry.")
    ] = 1.0
    backoff: Annotated[float, Field(ge=1, le=10, strict=True, description="Each further interval is the last one times this.")] = 2.0
    max_interval_seconds: Annotated[float, Field(ge=0, le=86_400, strict=True, description="Upper bound of an interval.")] = 60.0

    def schedule(self) -> RetrySchedule:
        """The retries as the run driver (engine/driver.py) keeps them."""
        return RetrySchedule(max_attempts=self.max_attempts, initial_interval=self.initial_interval_seconds,
                             backoff=self.backoff, max_interval=self.max_interval_seconds)

    def interval(self, attempt: int) -> float:
        """Delay before attempt ``attempt`` (2 is the first retry)."""
        return self.schedule().interval(attempt)


def _check_provider(name: str) -> None:
    known = available_provider_names()
    if name not in known:
        raise PydanticCustomError(
            "unknown_provider",
            "unknown sandbox provider '{provider}'; available: {known}",
            {"provider": name, "known": ", ".join(sorted(known)), "subloc": ["provider"]},
        )


_FIXED = " Fixed at creation: a run's program cannot change under it (create a new Workflow instead)."

_UNSET_PROVIDER = (" Unset: the operator's default provider (dsb operator --default-provider; the chart's defaultProvider, "
                   "kubernetes when the chart's kubernetes provider is on), pinned when the operator first takes it "
                   "up; dsb run uses local.")


class ResourceSandboxSettings(SandboxOptions):
    """The sandbox settings of a Workflow or a Sandbox resource: the provider may be left to the operator."""

    provider: Annotated[
        str, Field(min_length=1, pattern=PROVIDER_NAME_PATTERN, description=PROVIDER_DESCRIPTION + _UNSET_PROVIDER)
    ] | None = None

    def settings(self, provider: str) -> SandboxSettings:
        """These settings as a run's sandbox, with ``provider`` (the one decided for it) when they name none."""
        return SandboxSettings(provider=self.provider or provider, template=self.template, env=list(self.env),
                               lease_seconds=self.lease_seconds)


def signal_problems(signals: dict[str, Any]) -> dict[str, str]:
    """Why each refused signal is refused (key -> message; the key "" for the bound on all of them together):
    a value over SIGNAL_MAX_BYTES of JSON, or the first values past SIGNALS_MAX_BYTES in all, or an answer to a
    replay callback (``replay:<op id>``) other than "rerun" or "skip"."""
    problems: dict[str, str] = {}
    total = 0
    for key in sorted(signals):
        size = len(json.dumps(signals[key], separators=(",", ":"), ensure_ascii=False).encode())
        if (wrong := answer_problem(key, signals[key])) is not None:
            problems[key] = wrong  # never delivered: the replay would fail on it (a signal cannot change later)
        elif size > SIGNAL_MAX_BYTES:
            problems[key] = (f"the value is {size} bytes of JSON; a signal may be at most {SIGNAL_MAX_BYTES} (pass a "
                             f"reference to large data instead, e.g. a URL or an object name)")
        elif total + size > SIGNALS_MAX_BYTES:
            problems[key] = (f"with this value the signals add up to more than {SIGNALS_MAX_BYTES} bytes of JSON, "
                             f"the most all signals together may be")
        else:
            total += size
    return problems


def without_refused_signals(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``body`` (a Workflow) without the signals :func:`signal_problems` refuses, and the refusals by key: a
    refused signal must not stop the rest of the spec (or the other signals) from being acted on."""
    spec = body.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("signals"), dict):
        return body, {}
    signals: dict[str, Any] = spec["signals"]
    refused = signal_problems(signals)
    if not refused:
        return body, {}
    kept = {k: v for k, v in signals.items() if k not in refused}
    return {**body, "spec": {**spec, "signals": kept}}, refused


WORKER_NEEDS_ENTRYPOINT = "worker needs entrypoint (toolCalls are run by the operator's built-in sandbox-agent)"
FORK_NEEDS_TOOL_CALLS = ("forkOf needs toolCalls and no sandboxRef (the new tail runs in the fork's own sandbox, "
                         "rebuilt at the source's state after afterCall)")


class WorkflowForkSource(_Model):
    """spec.forkOf: the Workflow whose run the new one starts from, as it was after its sandbox call afterCall."""

    workflow: Annotated[str, Field(min_length=1, max_length=253, description="A Workflow of this namespace (never "
                        "another's), identified by its name and its uid when the fork is made: its run's first "
                        "afterCall sandbox calls become the fork's, and its sandbox is rebuilt at that state.")]
    after_call: Annotated[int, Field(ge=0, le=10_000, strict=True, description="How many of the source's completed "
                          "sandbox calls the fork starts with (its sandbox state after that call); at most the "
                          "calls the source's run completed.")]

    @field_validator("workflow")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        return _dns1123(value)


class WorkflowSpec(_Model):
    """What to run and how. The program (toolCalls or entrypoint and input, sandbox or sandboxRef) is fixed
    at creation; suspend, cancel and signals steer the run while it goes."""

    tool_calls: Annotated[
        list[ToolCallSpec],
        Field(
            min_length=1,
            max_length=10_000,
            description="Tool calls run in order in one sandbox by the built-in sandbox-agent workflow. Each "
            "completed call is journaled before the next starts, so a restart or a lost sandbox never repeats "
            "one. Set exactly one of toolCalls or entrypoint." + _FIXED,
        ),
    ] | None = None
    entrypoint: str | None = Field(
        default=None,
        description="A workflow function, 'package.module:function', from a module the operator is configured "
        "to import (dsb operator --workflows). Set exactly one of toolCalls or entrypoint." + _FIXED,
    )
    input: JsonValue = Field(
        default=None,
        description="The entrypoint's argument, any JSON value (only with entrypoint)." + _FIXED,
    )
    worker: WorkerSpec | None = Field(
        default=None,
        description="Execute the entrypoint in the namespace's own workers listening on this queue (dsb worker "
        "--kube), not in the operator, which then need not be able to import it (only with entrypoint)." + _FIXED,
    )
    sandbox: ResourceSandboxSettings | None = Field(
        default=None,
        description="The sandbox the toolCalls run in (the operator's default provider when neither sandbox nor "
        "sandboxRef is set, or sandbox names no provider). Set at most one of sandbox or sandboxRef." + _FIXED,
    )
    sandbox_ref: SandboxRef | None = Field(
        default=None,
        description="Run the tool calls in the live sandbox of this Sandbox resource (one Workflow holds it at a "
        "time) instead of provisioning one from inline sandbox settings; dsb run, which has no cluster, makes a "
        "sandbox from the settings of the Sandbox of that name in the same file." + _FIXED,
    )
    fork_of: WorkflowForkSource | None = Field(
        default=None,
        description="Start from another Workflow's run after one of its sandbox calls (docs/forks.md): the run "
        "begins with the source's first afterCall calls, its sandbox rebuilt at that state (the newest snapshot at "
        "or before it restored, the calls since replayed with the outcome check), then runs toolCalls (the new "
        "tail). Only with toolCalls." + _FIXED,
    )
    snapshot_every_n_calls: Annotated[
        int,
        Field(
            ge=0,
            le=10_000,
            strict=True,
            description="Snapshot the sandbox after every N completed tool calls (0: never). After a sandbox is "
            "lost, the run restores the newest snapshot and replays only the calls after it; superseded "
            "snapshots are deleted.",
        ),
    ] = 0
    retain_latest_snapshot: StrictBool = Field(
        default=False,
        description="Keep the newest snapshot when the run succeeds (status.latestSnapshot names it); otherwise "
        "every snapshot is deleted when the run finishes.",
    )
    inject_loss_after_n_calls: Annotated[
        int,
        Field(
            ge=1,
            strict=True,
            description="Testing: destroy the sandbox behind the run's back after this many calls, once, to "
            "exercise recovery (providers with loss injection only).",
        ),
    ] | None = None
    retry: RetrySpec | None = Field(
        default=None,
        description="Retry the run when it fails. A retry resumes from the journal: completed calls are not "
        "run again. Unset: one attempt.",
    )
    failure_policy: FailurePolicy | None = Field(
        default=None,
        description="Which tool-call outcomes fail the run, for every call (a call's own failurePolicy "
        "overrides it). Unset: every outcome is a completed call.",
    )
    timeout_seconds: Annotated[
        int,
        Field(
            ge=1,
            strict=True,
            description="Cancel the run (phase Cancelled; condition Failed with the message 'timed out after Ns "
            "(spec.timeoutSeconds)'), cleaning up its sandbox, when it has not finished this many seconds after "
            "it was created; waiting and suspended time count. Unset: no limit.",
        ),
    ] | None = None
    suspend: StrictBool = Field(
        default=False,
        description="true pauses the run at the next call boundary and hibernates its sandbox (a snapshot, no "
        "live sandbox); false resumes it from there. Like batch/v1 Job's suspend.",
    )
    cancel: StrictBool = Field(
        default=False,
        description="true cancels the run and deletes its sandbox and snapshots. Can only go from false to true.",
    )
    signals: dict[Annotated[str, Field(min_length=1)], JsonValue] = Field(
        default_factory=dict,
        description="Answers to the run's callbacks: callback id -> any JSON value (status.pendingCallbacks lists "
        "what the run waits for). Keys can only be added, and a value cannot change once given.",
    )
    ttl_seconds_after_finished: Annotated[
        int,
        Field(
            ge=0,
            strict=True,
            description="Delete the Workflow this many seconds after it finished (succeeded, failed or "
            "cancelled), cleanup included, as a Job's TTL does. Unset: kept.",
        ),
    ] | None = None
    hibernate_after_seconds: Annotated[
        int,
        Field(
            ge=0,
            strict=True,
            description="Seconds a waiting run (for a signal or a timer) keeps its sandbox live before it "
            "hibernates it (snapshot, then destroy; restored when the run continues). 0: at once. Unset: 300.",
        ),
    ] | None = None

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

    @field_validator("signals")
    @classmethod
    def _bounded_signals(cls, value: dict[str, Any]) -> dict[str, Any]:
        # A signal is carried in the run's journal head (every commit rewrites it) and in the Workflow object
        # (which the API server caps at 1.5 MiB, status and kopf's bookkeeping included): a huge value would
        # make every later write of the object fail, its finalizer included.
        for key, problem in signal_problems(value).items():
            raise PydanticCustomError("signal_too_large", "{problem}", {"problem": problem, "subloc": [key] if key else []})
        return value

    @field_validator("sandbox")
    @classmethod
    def _known_provider(cls, value: ResourceSandboxSettings | None) -> ResourceSandboxSettings | None:
        if value is not None and value.provider is not None:
            _check_provider(value.provider)
        return value

    @model_validator(mode="after")
    def _one_program(self) -> WorkflowSpec:
        if (self.tool_calls is None) == (self.entrypoint is None):
            which = "both are set" if self.tool_calls is not None else "neither is set"
            raise ValueError(f"set exactly one of toolCalls or entrypoint ({which})")
        if self.input is not None and self.entrypoint is None:
            raise ValueError("input is the entrypoint's argument; it needs entrypoint (toolCalls take no input)")
        if self.worker is not None and self.entrypoint is None:
            raise ValueError(WORKER_NEEDS_ENTRYPOINT)
        if self.sandbox is not None and self.sandbox_ref is not None:
            raise ValueError("set at most one of sandbox or sandboxRef")
        if self.fork_of is not None and (self.tool_calls is None or self.sandbox_ref is not None):
            raise ValueError(FORK_NEEDS_TOOL_CALLS)
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


class SandboxSource(_Model):
    """spec.from: the Sandbox (or Workflow's run) whose session the new Sandbox starts from, as it was after call
    afterCall."""

    sandbox: Annotated[str, Field(min_length=1, max_length=253)] | None = Field(
        default=None, description="A Sandbox of this namespace (never another's): its session's first afterCall "
        "calls become the new Sandbox's, and its workspace is rebuilt from them.")
    workflow: Annotated[str, Field(min_length=1, max_length=253)] | None = Field(
        default=None, description="A Workflow of this namespace (never another's): its run's first afterCall "
        "sandbox calls become the new Sandbox's (its uid read when the fork's session is first opened); who calls the "
        "fork must be allowed to get that Workflow.")
    after_call: Annotated[int, Field(ge=0, strict=True)] = Field(
        description="How many of the source's session calls the new Sandbox starts with (its state after that call).")

    @model_validator(mode="after")
    def _one_source(self) -> SandboxSource:
        if (self.sandbox is None) == (self.workflow is None):
            raise ValueError("set exactly one of sandbox or workflow")
        return self


# A Workflow's inline `sandbox` settings plus what only a standalone Sandbox has.
class SandboxResourceSpec(ResourceSandboxSettings):
    """A sandbox's settings; Workflows use them through spec.sandboxRef."""

    # A standalone Sandbox renews its own lease, so a short one only makes loss detection sooner.
    lease_seconds: Annotated[int, Field(
        ge=5, le=86_400, strict=True,
        description="The provider lease in seconds; the operator renews it at half its length while the Sandbox exists.",
    )] = 3600
    suspend: StrictBool = Field(
        default=False, description="true snapshots the sandbox and destroys it (no live sandbox); false restores it."
    )
    from_snapshot: Annotated[
        str, Field(min_length=1, description="Create the sandbox from this provider snapshot id.")
    ] | None = None
    from_: SandboxSource | None = Field(
        default=None, alias="from", description="Start from another Sandbox's session (or a Workflow's run) after "
        "one of its calls (docs/forks.md): a fork. Fixed at creation.")
    idle_suspend_after_seconds: Annotated[int, Field(
        ge=1, le=2_592_000, strict=True,
        description="Suspend the sandbox (snapshot, then destroy it) once no Workflow has held it for this many "
        "seconds; the next Workflow that uses it (spec.sandboxRef) resumes it from the snapshot. Unset: never on "
        "idleness. spec.suspend wins over it.",
    )] | None = None
    snapshot_every_n_calls: Annotated[int, Field(
        ge=0, le=10_000, strict=True,
        description="Snapshot the sandbox after every N completed session calls (calls made to this Sandbox "
        "through the call API); a lost sandbox is restored from the newest snapshot and only the session calls "
        "after it are replayed. 0: no session snapshots (a loss replays every session call).",
    )] = 0

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str | None) -> str | None:
        known = available_provider_names()
        if value is not None and value not in known:
            raise ValueError(f"unknown sandbox provider {value!r}; available: {', '.join(sorted(known))}")
        return value

    def settings(self, provider: str) -> SandboxSettings:
        # A Workflow's own lease is at least a minute; a shorter Sandbox lease is the Sandbox's to renew.
        return SandboxSettings(provider=self.provider or provider, template=self.template, env=list(self.env),
                               lease_seconds=max(60, self.lease_seconds))


# --------------------------------------------------------------------------------------------- status


class Condition(_Status):
    """metav1.Condition: one aspect of the run's state."""

    type: str = Field(
        description=f"{', '.join(WORKFLOW_CONDITIONS[:-1])} or {WORKFLOW_CONDITIONS[-1]}."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="A CamelCase reason for the last transition.")
    message: str = Field(default="", description="What happened, for people.")
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation of the spec this condition was set from."
    )


class CallsStatus(_Status):
    """Progress in tool calls."""

    completed: int = Field(default=0, description="Tool calls completed (a nonzero exit counts as completed).")
    total: int = Field(default=0, description="Tool calls in spec.toolCalls (0 for an entrypoint workflow).")


class CurrentCall(_Status):
    """The operation in flight (a tool call or a step) while the run is Running."""

    op_id: str = Field(description="Its operation id in the journal.")
    kind: str = Field(description="sandbox.call for a tool call, step for a workflow step.")
    name: str = Field(description="What it is (for a tool call: its type and a summary).")
    index: int | None = Field(default=None, description="A tool call's position in spec.toolCalls (from 0).")
    target: str | None = Field(default=None, description="A tool call's command (or path), cut to 200 characters.")


class PendingCallbackStatus(_Status):
    """A callback the run is waiting for; answer it with spec.signals[id]."""

    id: str = Field(description="The callback id: the key to set in spec.signals.")
    payload: JsonValue = Field(default=None, description="What the workflow sent with the callback (JSON).")


class StatusError(_Status):
    """Why the run failed or was cancelled (the journal has every attempt's error)."""

    type: str = Field(description="The error's type, e.g. ProvisionError, StepFailed.")
    message: str = Field(description="What went wrong and what to do (secrets are never included).")


class OperationSummary(_Status):
    """One journal operation, in short."""

    op_id: str = Field(description="The operation id.")
    kind: str = Field(description="step, callback, sleep, sandbox.call, sandbox.snapshot, ...")
    name: str = Field(description="What it is.")
    status: str = Field(description="started, completed or failed.")
    attempt: int = Field(default=1, description="Which attempt of the operation this is.")
    target: str | None = Field(default=None, description="A tool call's command (or path), cut to 200 characters.")
    exit_code: int | None = Field(default=None, description="A shell call's exit code.")
    error: str | None = Field(default=None, description="Why it failed.")
    finished_at: str | None = Field(default=None, description="When it finished (RFC 3339).")


class JournalRef(_Status):
    """One owned object holding a chunk of the journal."""

    name: str = Field(description="The ConfigMap's name (in the Workflow's namespace, owned by the Workflow).")
    first_seq: int | None = Field(default=None, description="The first journal sequence number in it.")
    last_seq: int | None = Field(default=None, description="The last journal sequence number in it.")
    count: int = Field(default=0, description="How many journal records it holds.")


class SandboxStatusRef(_Status):
    """The sandbox the run works in now."""

    name: str | None = Field(default=None, description="The run's name for it (a Sandbox resource's, with sandboxRef).")
    provider: str | None = Field(default=None, description="The provider holding it.")
    provider_id: str | None = Field(default=None, description="The provider's id of the live sandbox.")
    runtime_class_name: str | None = Field(
        default=None, description="The RuntimeClass the sandbox runs under (gVisor, Kata...), when its provider says.")


class ChainRunStatus(_Status):
    """One run of a Workflow's continue-as-new chain."""

    run_id: str = Field(description="The run's id in the journal: <name>-<uid[:8]>, then <that>~1, ~2, ...")
    outcome: str = Field(
        description="How it ended: ContinuedAsNew, or for the run the Workflow is at its phase (Running, Waiting, "
        "Succeeded, Failed, Cancelled...)."
    )
    started_at: str | None = Field(default=None, description="When the run started (RFC 3339).")
    finished_at: str | None = Field(default=None, description="When it ended (RFC 3339); none while it runs.")


class WorkflowStatus(_Status):
    """Where the run is: a bounded projection of its journal (the journal itself is in the ConfigMaps
    listed in journal), written by the operator through the status subresource."""

    conditions: list[Condition] = Field(
        default_factory=list,
        description=f"{', '.join(WORKFLOW_CONDITIONS)} (metav1.Condition; kubectl wait --for=condition=Succeeded).",
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation of the spec the operator last acted on."
    )
    phase: str | None = Field(
        default=None,
        description="One word for kubectl get: Pending, Running, Waiting, Suspended, Retrying (an attempt "
        "failed and spec.retry starts another at wakeAt), Succeeded, Failed, Cancelled. The conditions carry the "
        "detail.",
    )
    run_id: str | None = Field(
        default=None,
        description="The run's id in the journal: <name>-<uid[:8]>; after ctx.continue_as_new, the chain's run the "
        "Workflow is at (<name>-<uid[:8]>~<n>).",
    )
    runs: list[ChainRunStatus] = Field(
        default_factory=list,
        description="The Workflow's continue-as-new chain, newest first (the run it is at, then the ones that "
        "continued as new), at most 20; empty for a run that never continued as new.",
    )
    calls: CallsStatus | None = Field(default=None, description="Progress in tool calls.")
    current_call: CurrentCall | None = Field(
        default=None, description="The operation in flight; absent between operations."
    )
    pending_callbacks: list[PendingCallbackStatus] = Field(
        default_factory=list, description="Callbacks the run waits for (answer with spec.signals)."
    )
    wake_at: str | None = Field(
        default=None, description="When a run that is sleeping (a durable timer or a retry backoff) wakes (RFC 3339)."
    )
    attempt: int | None = Field(default=None, description="The run attempt (1 is the first; spec.retry adds more).")
    max_attempts: int | None = Field(default=None, description="Attempts in all (spec.retry.maxAttempts; 1 without it).")
    error: StatusError | None = Field(default=None, description="Why the run (or its last attempt) failed.")
    recent_operations: list[OperationSummary] = Field(
        default_factory=list,
        description="The last operations of the journal (at most 20); dsb --kube history shows all of them.",
    )
    journal: list[JournalRef] = Field(
        default_factory=list,
        description="The ConfigMaps holding the journal, in order (owned by the Workflow, deleted with it).",
    )
    sandbox: SandboxStatusRef | None = Field(default=None, description="The sandbox the run works in now.")
    latest_snapshot: str | None = Field(
        default=None, description="The provider's id of the newest sandbox snapshot (older ones are deleted)."
    )
    recovery_count: int = Field(
        default=0, description="How many times the run recovered from a lost sandbox (restore and replay)."
    )
    result: JsonValue = Field(
        default=None, description="The run's result (JSON) when it succeeded and is small; see resultRef otherwise."
    )
    result_ref: str | None = Field(
        default=None,
        description="Where a result too large for status is kept: the ConfigMap holding it (dsb --kube inspect "
        "prints it).",
    )
    started_at: str | None = Field(default=None, description="When the run started (RFC 3339).")
    finished_at: str | None = Field(
        default=None, description="When the run succeeded, failed or was cancelled (RFC 3339)."
    )
    kopf: dict[str, Any] | None = Field(
        default=None,
        description="The operator's own bookkeeping (kopf's handler progress), kept here rather than in "
        "annotations so GitOps diffs stay clean. Not for users.",
    )


class SandboxOperation(_Status):
    """A provider operation recorded before it starts (intent), so a restart finishes it exactly once."""

    id: str = Field(description="The operation id (stable across retries and restarts).")
    kind: Literal["provision", "restore", "snapshot", "destroy"] = Field(description="What the operation does.")
    snapshot_id: str | None = Field(
        default=None, description="restore: the snapshot restored; destroy: the snapshot just recorded."
    )


class SandboxRewind(_Status):
    """The newest rewind of the Sandbox's session (sessions/rewind.py); the journal keeps them all."""

    to_call: int = Field(description="The calls kept: the session's first toCall; the next call continues after them.")
    rewound: list[str] = Field(default_factory=list, description="The operation ids of the calls rewound (journaled "
                               "as rewound, never deleted: `dsb --kube history sandbox/NAME` shows them).")
    at: str = Field(description="When the rewind was done (RFC 3339).")


class SandboxResourceStatus(_Status):
    """Where the sandbox is, written by the operator."""

    conditions: list[Condition] = Field(
        default_factory=list, description=f"{', '.join(SANDBOX_CONDITIONS)} (metav1.Condition list)."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation of the spec the operator last acted on."
    )
    phase: str | None = Field(default=None, description="One word for kubectl get.")  # printer convenience
    provider: str | None = Field(
        default=None, description="The provider it uses: spec.provider, or the operator's default when that is unset; "
        "fixed when the operator first reconciles the Sandbox."
    )
    provider_id: str | None = Field(default=None, description="The provider's id of the live sandbox.")
    handle: dict[str, Any] | None = Field(
        default=None, description="The provider's handle metadata for the live sandbox (never secrets)."
    )
    capabilities: dict[str, Any] | None = Field(default=None, description="What the provider can do with it.")
    lease_expires_at: str | None = Field(default=None, description="When the provider's lease ends (RFC 3339).")
    snapshots: list[str] = Field(
        default_factory=list, description="Snapshot ids the provider holds for it, oldest first (owned by this Sandbox)."
    )
    operation: SandboxOperation | None = Field(
        default=None, description="The provider operation in progress, recorded before it starts."
    )
    operation_count: int = Field(default=0, description="How many provider operations were started (numbers their ids).")
    holder: str | None = Field(default=None, description="The Workflow whose calls run in this sandbox now.")
    loss_reported: str | None = Field(
        default=None, description="The live sandbox a session call found gone or unusable: a hint that makes the "
        "controller check it now (with the provider) instead of at its next lease renewal.",
    )
    last_rewind: SandboxRewind | None = Field(
        default=None, description="The newest rewind of its session (POST .../rewind, `dsb sandbox rewind`).",
    )
    state: str | None = Field(
        default=None, description="Ready: live and held by a Workflow; Idle: live, no Workflow holds it (so no call "
        "runs); Suspended: no live sandbox (spec.suspend, or spec.idleSuspendAfterSeconds).",
    )
    state_since: str | None = Field(default=None, description="Since when state holds (RFC 3339).")
    kopf: dict[str, Any] | None = Field(
        default=None, description="The operator's own bookkeeping (kopf's handler progress). Not for users."
    )


# --------------------------------------------------------------------------------------------- resources


class WorkflowResource(_Model):
    """A durable run: the built-in sandbox-agent over spec.toolCalls, or a workflow function
    (spec.entrypoint), journaled so that it survives operator restarts and sandbox loss."""

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


class SandboxPoolSpec(_Model):
    """A pool of warm sandbox Pods of one PodTemplate (the kubernetes provider): a provision of
    ``podtemplate/<template>`` in this namespace claims one of them instead of making a Pod."""

    template: Annotated[str, Field(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The PodTemplate (in this namespace) the pool's Pods are made from; Workflows use it as "
        "template: podtemplate/<this name>. Editing the PodTemplate rolls the pool.",
    )]
    size: Annotated[int, Field(ge=0, le=200, strict=True,
                               description="How many ready, unclaimed Pods the pool keeps.")]


class SandboxPoolStatus(_Status):
    """How full the pool is, written by the operator."""

    conditions: list[Condition] = Field(default_factory=list, description="Ready: the pool holds spec.size ready Pods.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation of the spec the operator last acted on."
    )
    ready: int = Field(default=0, description="Warm Pods: running, checked, unclaimed, of the current template.")
    starting: int = Field(default=0, description="Pods made for the pool that are not ready yet.")
    claimed: int = Field(default=0, description="Pods of the pool claimed by a sandbox and not deleted yet.")
    total: int = Field(default=0, description="ready + starting + claimed.")
    template_hash: str | None = Field(default=None, description="The hash of the template the pool's Pods have now.")
    kopf: dict[str, Any] | None = Field(
        default=None, description="The operator's own bookkeeping (kopf's handler progress). Not for users."
    )


class SandboxPoolResource(_Model):
    api_version: Literal["durable-sandbox.dev/v1alpha1"] = "durable-sandbox.dev/v1alpha1"
    kind: Literal["SandboxPool"] = "SandboxPool"
    metadata: ObjectMeta
    spec: SandboxPoolSpec
    status: SandboxPoolStatus | None = None


Resource = WorkflowResource | SandboxResource
KINDS: Final[Mapping[str, type[WorkflowResource] | type[SandboxResource]]] = {
    "Workflow": WorkflowResource,
    "Sandbox": SandboxResource,
}


def to_sandbox_agent_input(spec: WorkflowSpec, sandbox: SandboxSettings | None = None, *,
                           provider: str = "local") -> SandboxAgentInput:
    """The ``sandbox-agent`` input for a toolCalls Workflow. ``sandbox`` overrides ``spec.sandbox`` (the caller
    resolves ``sandboxRef`` to settings); ``provider`` is the one when neither names a provider."""
    if spec.tool_calls is None:
        raise ValueError("this Workflow has an entrypoint, not toolCalls; it does not run sandbox-agent")
    if sandbox is None:
        sandbox = spec.sandbox.settings(provider) if spec.sandbox is not None else SandboxSettings(provider=provider)
    return SandboxAgentInput(
        tool_calls=list(spec.tool_calls),
        sandbox=sandbox,
        snapshot_every_n_calls=spec.snapshot_every_n_calls,
        retain_latest_snapshot=spec.retain_latest_snapshot,
        inject_loss_after_n_calls=spec.inject_loss_after_n_calls,
        hibernate_after_seconds=spec.hibernate_after_seconds,
        failure_policy=spec.failure_policy,
    )


__all__ = [
    "FORK_NEEDS_TOOL_CALLS",
    "KINDS",
    "WORKER_NEEDS_ENTRYPOINT",
    "WORKER_QUEUE_PATTERN",
    "CallsStatus",
    "Condition",
    "CurrentCall",
    "EnvVar",
    "FailurePolicy",
    "JournalRef",
    "ObjectMeta",
    "OperationSummary",
    "PendingCallbackStatus",
    "ReadFileCall",
    "Resource",
    "ResourceSandboxSettings",
    "RetrySpec",
    "SandboxPoolResource",
    "SandboxPoolSpec",
    "SandboxPoolStatus",
    "SandboxRef",
    "SandboxResource",
    "SandboxResourceSpec",
    "SandboxResourceStatus",
    "SandboxRewind",
    "SandboxSettings",
    "SandboxSource",
    "SandboxStatusRef",
    "ShellCall",
    "StatusError",
    "ToolCallSpec",
    "WorkerSpec",
    "WorkflowForkSource",
    "WorkflowResource",
    "WorkflowSpec",
    "WorkflowStatus",
    "WriteFileCall",
    "available_provider_names",
    "to_sandbox_agent_input",
]
