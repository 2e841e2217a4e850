"""What a Workflow spec means: the run it asks for (workflow, input, run id) and how to drive it
(signals, cancel, suspend, retry, timeout, TTL).

One meaning for `dsb run` (local) and for the operator (cluster), so a manifest does the same thing in
both places. Everything is checked here, before any run is created, so an invalid spec never leaves a
half-started run (or a provisioned sandbox) behind. Where the two differ, it is said here:

- run id: locally ``<name>-<hash of workflow and input>`` (running the same file again continues the
  same run); in the cluster ``<name>-<uid[:8]>`` (one Workflow object = one run, a re-created object
  is a new run).
- ``sandbox.env[].valueFrom.secretKeyRef`` only resolves in the cluster; the run input keeps the
  reference, never the value (the operator hands values to the sandbox at provision time). Literal
  ``value``s (and a call's ``env``) are kept out of the input too (``RunPlan.env_values``): the engine
  that drives the run needs ``AgentServices.env_values`` returning them by run id (`dsb run` keeps them
  beside its store, see ``runs/envfiles.py``; the operator re-plans the Workflow object).
- ``ttlSecondsAfterFinished``/``suspend`` only mean something in the cluster.
- a sandbox that names no provider: ``local`` for `dsb run`; in the cluster the operator decides
  (``kube/spec/provider_choice.py``: the provider its journal pinned, else its ``--default-provider``) and passes it
  as ``default_provider``.
- the operator imports workflow code only from the modules it is configured with
  (``allowed_modules``); the check happens before anything is imported.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine import WorkflowDefinition, WorkflowNotFound, resolve
from durable_sandbox.engine.driver import RunPolicy
from durable_sandbox.engine.errors import InvalidInput, NotAWorkflow
from durable_sandbox.kube.spec.entrypoints import entrypoint_allowed, foreign_step, module_allowed
from durable_sandbox.kube.spec.models import (
    RetrySpec,
    SandboxResource,
    SandboxSettings,
    WorkflowForkSource,
    WorkflowResource,
    to_sandbox_agent_input,
)
from durable_sandbox.kube.spec.queued import queued_workflow
from durable_sandbox.workflows import sandbox_agent

WORKFLOW_LABEL = "durable-sandbox.dev/workflow"
RUN_ID_LABEL = "durable-sandbox.dev/run-id"


class PlanError(ValueError):
    """The spec cannot be run as written; the message names the place (``<source>: Workflow/<name>: spec.x``)."""

    reason = "InvalidSpec"  # the condition reason the operator reports


class WorkflowNotAllowed(PlanError):
    """The entrypoint is outside the modules this operator may import (nothing was imported)."""

    reason = "WorkflowNotAllowed"


class WorkflowUnavailable(PlanError):
    """The entrypoint could not be imported in this process."""

    reason = "WorkflowNotFound"


@dataclass
class RunPlan:
    label: str  # how messages name it: "Workflow/hello" or "pkg.mod:fn"
    definition: WorkflowDefinition
    input: Any
    run_id: str | None
    labels: dict[str, str] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)
    cancel: bool = False
    suspend: bool = False
    retry: RetrySpec | None = None
    timeout: float | None = None
    ttl_seconds_after_finished: int | None = None
    provider: str | None = None  # the sandbox provider a toolCalls Workflow uses (None: chosen by the code)
    warnings: list[str] = field(default_factory=list)
    # A toolCalls Workflow's literal env values, kept out of `input` (which is stored): the engine's extension
    # value `AgentServices.env_values` must hand them back by run id (sandbox_agent.detach_env).
    env_values: dict[str, str] = field(default_factory=dict)
    where: str = ""  # "<source>: Workflow/<name>: ", for messages about the spec
    sandbox: SandboxSettings | None = None  # a toolCalls Workflow's sandbox, for the provider pre-run check
    snapshot_every: int = 0
    inject_loss_after: int | None = None
    worker_queue: str | None = None  # spec.worker.queue: executed by the namespace's workers, not the operator
    # spec.forkOf: the run starts with the source's first afterCall calls (kube/workflow/forking.py); `input` holds
    # the new tail only, `env_values` are keyed by the calls' places in the whole run (the tail after afterCall)
    fork_of: WorkflowForkSource | None = None

    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts

    @property
    def policy(self) -> RunPolicy:
        """The run's policy as a whole (spec.timeoutSeconds, spec.retry), as the run driver keeps it."""
        return RunPolicy(timeout=self.timeout, retry=self.retry.schedule() if self.retry is not None else None)


def cluster_run_id(name: str, uid: str) -> str:
    """The run id of a Workflow object in a cluster: one object, one run; a re-created object is a new run."""
    return f"{name}-{uid[:8]}"


def short_hash(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def local_run_id(name: str, definition: WorkflowDefinition, value: Any) -> str:
    """The run id `dsb run` gives a manifest's Workflow: the same file continues the same run."""
    return f"{name}-{short_hash(definition.name, value)}"


def resolve_workflow(ref: str, where: str) -> WorkflowDefinition:
    try:
        return resolve(ref)
    except NotAWorkflow as exc:
        raise PlanError(f"{where}{exc}") from exc  # final: no other replica would find a workflow there either
    except WorkflowNotFound as exc:
        raise WorkflowUnavailable(f"{where}{exc}") from exc


def check_input(definition: WorkflowDefinition, value: Any, where: str, root: str = "input") -> None:
    """Validate the input against the workflow's declared type now, not inside the run (one line: the
    place, what was expected and given, the parameter; ``root`` names the input: ``spec.input``)."""
    try:
        definition.check_input(value, root=root)
    except InvalidInput as exc:
        raise PlanError(f"{where}{exc}") from exc


def plan_workflow(
    wf: WorkflowResource,
    *,
    source: str,
    sandboxes: Mapping[str, SandboxResource] | None = None,
    run_id: str | None = None,
    cluster: bool = False,
    allowed_modules: Sequence[str] | None = None,
    default_provider: str = "local",
    executing_worker: bool = False,
) -> RunPlan:
    """The run plan of one Workflow.

    ``sandboxes`` are the Sandbox resources ``spec.sandboxRef`` may name (the same file locally, the
    namespace in the cluster). ``cluster`` selects the cluster's meaning (see the module doc); it needs
    ``metadata.uid``. ``allowed_modules`` (operator policy) limits which entrypoints may be imported.
    ``default_provider``: the provider of a toolCalls sandbox that names none. A Workflow with ``spec.worker`` is
    planned without importing its entrypoint (:func:`queued_workflow`) unless ``executing_worker`` (the worker
    that executes it, which imports it itself).
    """
    spec = wf.spec
    name = wf.metadata.name
    where = f"{source}: Workflow/{name}: "
    warnings: list[str] = []
    settings = _sandbox_settings(wf, sandboxes, cluster=cluster, where=where, warnings=warnings,
                                 default_provider=default_provider)
    if not cluster:
        _check_local(wf, settings, where=where, warnings=warnings)
    if spec.worker is not None and not executing_worker:
        assert spec.entrypoint is not None  # the model refuses a worker without one
        program = _Program(queued_workflow(spec.entrypoint, spec.worker.queue), spec.input, spec.input, {}, None)
    else:
        program = _program(wf, settings, cluster=cluster, where=where, allowed_modules=allowed_modules)
    if cluster:
        if not wf.metadata.uid:
            raise PlanError(f"{where}metadata.uid is missing; the cluster assigns it (read the object back from the API)")
        the_run_id = cluster_run_id(name, wf.metadata.uid)
    else:
        the_run_id = run_id or local_run_id(name, program.definition, program.identity)
    return RunPlan(
        label=f"Workflow/{name}",
        definition=program.definition,
        input=program.value,
        run_id=the_run_id,
        labels={WORKFLOW_LABEL: name},
        signals=dict(spec.signals),
        cancel=spec.cancel,
        suspend=spec.suspend,
        retry=spec.retry,
        timeout=float(spec.timeout_seconds) if spec.timeout_seconds is not None else None,
        ttl_seconds_after_finished=spec.ttl_seconds_after_finished,
        provider=program.provider,
        warnings=warnings,
        env_values=shifted_env_values(program.env_values, spec.fork_of.after_call) if spec.fork_of else program.env_values,
        where=where,
        sandbox=settings if spec.tool_calls is not None else None,
        snapshot_every=spec.snapshot_every_n_calls,
        inject_loss_after=spec.inject_loss_after_n_calls,
        worker_queue=spec.worker.queue if spec.worker is not None else None,
        fork_of=spec.fork_of,
    )


_CALL_ENV_KEY = re.compile(r"^toolCalls\[(\d+)\]\.")


def shifted_env_values(values: dict[str, str], by: int) -> dict[str, str]:
    """A fork's env values as its whole run places them: its own toolCalls come after the source's ``by`` calls."""
    def moved(key: str) -> str:
        m = _CALL_ENV_KEY.match(key)
        return f"toolCalls[{int(m.group(1)) + by}].{key[m.end():]}" if m else key
    return {moved(k): v for k, v in values.items()}


def _sandbox_settings(wf: WorkflowResource, sandboxes: Mapping[str, SandboxResource] | None, *, cluster: bool,
                      where: str, warnings: list[str], default_provider: str) -> SandboxSettings:
    """The sandbox the Workflow's calls run in: spec.sandbox, or the settings of the Sandbox spec.sandboxRef names,
    with ``default_provider`` when they name none."""
    spec = wf.spec
    own = spec.sandbox.settings(default_provider) if spec.sandbox is not None else SandboxSettings(provider=default_provider)
    if spec.sandbox_ref is None:
        return own
    ref = (sandboxes or {}).get(spec.sandbox_ref.name)
    if ref is not None:
        return ref.spec.settings(default_provider)
    if cluster:
        raise PlanError(
            f"{where}spec.sandboxRef: Sandbox {spec.sandbox_ref.name!r} does not exist in this namespace; "
            f"create it or use spec.sandbox"
        )
    warnings.append(
        f"{where}spec.sandboxRef: Sandbox {spec.sandbox_ref.name!r} is not in this file; "
        f"ignored locally (using a default local sandbox)"
    )
    return own


def _check_local(wf: WorkflowResource, settings: SandboxSettings, *, where: str, warnings: list[str]) -> None:
    """What `dsb run` cannot honour: cluster-only fields (a warning), Secret references (an error)."""
    spec = wf.spec
    if spec.fork_of is not None:
        raise PlanError(
            f"{where}spec.forkOf: a fork of Workflow {spec.fork_of.workflow!r} is made in a cluster, from its run "
            f"there; locally fork a run with `dsb run module:function --fork-of RUN --after N` or `dsb fork RUN "
            f"--after N`"
        )
    for field_name, active in (
        ("ttlSecondsAfterFinished", spec.ttl_seconds_after_finished is not None),
        ("suspend", spec.suspend),
    ):
        if active:
            warnings.append(f"{where}spec.{field_name}: only meaningful in a cluster; ignored by dsb run")
    for i, var in enumerate(settings.env):
        if var.value_from is not None:
            ref_ = var.value_from.secret_key_ref
            raise PlanError(
                f"{where}spec.sandbox.env[{i}].valueFrom: Secret {ref_.name}/{ref_.key} can only be read in a "
                f"cluster; for dsb run give env var {var.name} a value"
            )


@dataclass(frozen=True)
class _Program:
    definition: WorkflowDefinition
    value: Any  # the stored input
    identity: Any  # what the local run id is derived from (the input with its env values)
    env_values: dict[str, str]
    provider: str | None


def _program(wf: WorkflowResource, settings: SandboxSettings, *, cluster: bool, where: str,
             allowed_modules: Sequence[str] | None) -> _Program:
    """The workflow and its input: sandbox-agent over spec.toolCalls, or spec.entrypoint (checked against
    the operator's allowed modules before anything is imported) with spec.input."""
    spec = wf.spec
    if spec.tool_calls is not None:
        definition = resolve_workflow(sandbox_agent.NAME, where)
        agent_input = to_sandbox_agent_input(spec, settings)
        if cluster and spec.sandbox_ref is not None:
            # In the cluster the calls run in the Sandbox's own live sandbox (attached, never provisioned).
            agent_input = agent_input.model_copy(update={"sandbox_ref": spec.sandbox_ref.name})
        # The run id is derived from the whole input, values included (another value is another run);
        # the stored input has them replaced by *** and the values travel beside it.
        identity: Any = agent_input.model_dump(mode="json", by_alias=True, exclude_none=True)
        stored, env_values = sandbox_agent.detach_env(agent_input)
        return _Program(definition, stored.model_dump(mode="json", by_alias=True, exclude_none=True), identity,
                        env_values, agent_input.sandbox.provider)
    assert spec.entrypoint is not None
    if allowed_modules is not None and not entrypoint_allowed(spec.entrypoint, allowed_modules):
        configured = ", ".join(allowed_modules) or "none"
        raise WorkflowNotAllowed(
            f"{where}spec.entrypoint: {spec.entrypoint!r} is not in a module this operator may import "
            f"(configured: {configured}); add its module to `dsb operator --workflows`, or use toolCalls. "
            f"Nothing was imported."
        )
    if allowed_modules is not None and (foreign := foreign_step(spec.entrypoint, allowed_modules)) is not None:
        # Looked up no further: a lookup in another module's object runs that module's code.
        raise WorkflowNotAllowed(
            f"{where}spec.entrypoint: {spec.entrypoint!r} reaches {foreign[0]!r}, defined in module {foreign[1]!r}, "
            f"which this operator may not import from (configured: {', '.join(allowed_modules)}); name the "
            f"workflow by its own module, and add that module to `dsb operator --workflows`."
        )
    definition = resolve_workflow(spec.entrypoint, f"{where}spec.entrypoint: ")
    defined_in = getattr(definition.fn, "__module__", "") or ""
    if allowed_modules is not None and not module_allowed(defined_in, allowed_modules):
        # `allowed.module:name.attr` can reach a function of any module through an attribute (an imported
        # module, a re-export): what counts is where the workflow function is defined.
        raise WorkflowNotAllowed(
            f"{where}spec.entrypoint: {spec.entrypoint!r} resolves to a workflow defined in module "
            f"{defined_in!r}, which this operator may not run (configured: {', '.join(allowed_modules) or 'none'}); "
            f"name the workflow by its own module, and add that module to `dsb operator --workflows`."
        )
    check_input(definition, spec.input, where, "spec.input")
    return _Program(definition, spec.input, spec.input, {}, None)


def plan_resources(resources: Sequence[Any], *, source: str, run_id: str | None = None) -> list[RunPlan]:
    """The local plans of a manifest's Workflows (its Sandboxes serve their sandboxRefs)."""
    workflows = [r for r in resources if isinstance(r, WorkflowResource)]
    sandboxes = {r.metadata.name: r for r in resources if isinstance(r, SandboxResource)}
    if not workflows:
        raise PlanError(f"{source}: no Workflow in this manifest (a Sandbox alone has nothing to run locally)")
    if run_id is not None and len(workflows) > 1:
        raise PlanError(f"--run-id needs a manifest with one Workflow; {source} has {len(workflows)}")
    plans = [plan_workflow(wf, source=source, sandboxes=sandboxes, run_id=run_id) for wf in workflows]
    names = [p.label for p in plans]
    if len(set(names)) != len(names):
        raise PlanError(f"{source}: two Workflows have the same name; names must be unique")
    return plans


def plan_entrypoint(target: str, value: Any, run_id: str | None) -> RunPlan:
    """The plan of `dsb run module:function` (or a registered workflow name)."""
    definition = resolve_workflow(target, "")
    check_input(definition, value, "")
    return RunPlan(label=definition.name, definition=definition, input=value, run_id=run_id)


__all__ = [
    "RUN_ID_LABEL",
    "WORKFLOW_LABEL",
    "PlanError",
    "RunPlan",
    "WorkflowNotAllowed",
    "WorkflowUnavailable",
    "check_input",
    "cluster_run_id",
    "entrypoint_allowed",
    "local_run_id",
    "plan_entrypoint",
    "plan_resources",
    "plan_workflow",
]
