"""What `dsb run` runs: a manifest's Workflows, or a ``module:function`` / registered workflow.

Everything is checked here, before any run is created, so an invalid manifest or input never leaves a
half-started run (or a provisioned sandbox) behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from durable_sandbox.cli.errors import CliError
from durable_sandbox.engine import WorkflowDefinition, WorkflowNotFound, resolve
from durable_sandbox.kube.manifests import ManifestError, format_loc, load_manifests
from durable_sandbox.kube.models import (
    RetrySpec,
    SandboxResource,
    SandboxSettings,
    WorkflowResource,
    to_sandbox_agent_input,
)
from durable_sandbox.kube.preflight import sandbox_problems
from durable_sandbox.workflows import sandbox_agent

WORKFLOW_LABEL = "durable-sandbox.dev/workflow"
# Run ids appear in commands, labels and file names: printable, no spaces, not empty.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")


def check_run_id(run_id: str | None) -> None:
    if run_id is not None and not RUN_ID.match(run_id):
        raise CliError(
            f"--run-id {run_id!r} is not a valid run id: use 1 to 253 letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit"
        )


@dataclass
class RunPlan:
    label: str  # how messages name it: "Workflow/hello" or "pkg.mod:fn"
    definition: WorkflowDefinition
    input: Any
    run_id: str | None
    labels: dict[str, str] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)
    cancel: bool = False
    retry: RetrySpec | None = None
    timeout: float | None = None
    warnings: list[str] = field(default_factory=list)
    env_values: dict[str, str] = field(default_factory=dict)  # kept out of the store (sandbox_agent.detach_env)


def add_cwd_to_path() -> None:
    """Let ``module:function`` resolve from the current directory, as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def is_manifest(target: str) -> bool:
    return target == "-" or target.endswith((".yaml", ".yml", ".json")) or Path(target).is_file()


def _resolve(ref: str, where: str) -> WorkflowDefinition:
    try:
        return resolve(ref)
    except WorkflowNotFound as exc:
        raise CliError(f"{where}{exc}") from exc


def check_input(definition: WorkflowDefinition, value: Any, where: str) -> None:
    """Validate the input against the workflow's declared type now, not inside the run."""
    try:
        definition.prepare_input(value)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = format_loc(["input", *err.get("loc", ())])
            lines.append(f"{where}{loc}: {err.get('msg')}")
        raise CliError("\n".join(lines)) from exc


def short_hash(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def plan_entrypoint(target: str, value: Any, run_id: str | None) -> RunPlan:
    check_run_id(run_id)
    definition = _resolve(target, "")
    check_input(definition, value, "")
    return RunPlan(label=definition.name, definition=definition, input=value, run_id=run_id)


def plan_manifest(target: str, run_id: str | None) -> list[RunPlan]:
    check_run_id(run_id)
    if target == "-":
        resources = load_manifests(sys.stdin.read(), source="<stdin>")
        source = "<stdin>"
    else:
        if not Path(target).is_file():
            raise CliError(f"{target}: no such manifest file")
        resources = load_manifests(Path(target))
        source = target
    workflows = [r for r in resources if isinstance(r, WorkflowResource)]
    sandboxes = {r.metadata.name: r for r in resources if isinstance(r, SandboxResource)}
    if not workflows:
        raise CliError(f"{source}: no Workflow in this manifest (a Sandbox alone has nothing to run locally)")
    if run_id is not None and len(workflows) > 1:
        raise CliError(f"--run-id needs a manifest with one Workflow; {source} has {len(workflows)}")
    plans = [_plan_workflow(source, wf, sandboxes, run_id) for wf in workflows]
    names = [p.label for p in plans]
    if len(set(names)) != len(names):
        raise CliError(f"{source}: two Workflows have the same name; names must be unique")
    return plans


def _plan_workflow(
    source: str, wf: WorkflowResource, sandboxes: dict[str, SandboxResource], run_id: str | None
) -> RunPlan:
    spec = wf.spec
    name = wf.metadata.name
    where = f"{source}: Workflow/{name}: "
    warnings: list[str] = []
    settings: SandboxSettings | None = spec.sandbox
    if spec.sandbox_ref is not None:
        ref = sandboxes.get(spec.sandbox_ref.name)
        if ref is not None:
            settings = ref.spec.settings()
        else:
            warnings.append(
                f"{where}spec.sandboxRef: Sandbox {spec.sandbox_ref.name!r} is not in this file; "
                f"ignored locally (using a default local sandbox)"
            )
    for field_name, active in (
        ("ttlSecondsAfterFinished", spec.ttl_seconds_after_finished is not None),
        ("suspend", spec.suspend),
    ):
        if active:
            warnings.append(f"{where}spec.{field_name}: only meaningful in a cluster; ignored by dsb run")
    if settings is not None:
        for i, var in enumerate(settings.env):
            if var.value_from is not None:
                ref_ = var.value_from.secret_key_ref
                raise CliError(
                    f"{where}spec.sandbox.env[{i}].valueFrom: Secret {ref_.name}/{ref_.key} can only be read in a "
                    f"cluster; for dsb run give env var {var.name} a value"
                )
    if spec.tool_calls is not None:
        problems = asyncio.run(
            sandbox_problems(
                settings or SandboxSettings(),
                snapshot_every=spec.snapshot_every_n_calls,
                inject_loss_after=spec.inject_loss_after_n_calls,
            )
        )
        if problems:
            raise CliError("\n".join(f"{where}{problem}" for problem in problems))
        definition = _resolve(sandbox_agent.NAME, where)
        agent_input = to_sandbox_agent_input(spec, settings)
        # The run id is derived from the whole input, values included (another value is another run);
        # what is stored is the input without them.
        identity: Any = agent_input.model_dump(mode="json", by_alias=True, exclude_none=True)
        stored, env_values = sandbox_agent.detach_env(agent_input)
        value: Any = stored.model_dump(mode="json", by_alias=True, exclude_none=True)
    else:
        assert spec.entrypoint is not None
        definition = _resolve(spec.entrypoint, f"{where}spec.entrypoint: ")
        value = identity = spec.input
        env_values = {}
        check_input(definition, value, f"{where}spec.")
    return RunPlan(
        label=f"Workflow/{name}",
        definition=definition,
        input=value,
        run_id=run_id or f"{name}-{short_hash(definition.name, identity)}",
        labels={WORKFLOW_LABEL: name},
        signals=dict(spec.signals),
        cancel=spec.cancel,
        retry=spec.retry,
        timeout=float(spec.timeout_seconds) if spec.timeout_seconds is not None else None,
        warnings=warnings,
        env_values=env_values,
    )


__all__ = [
    "WORKFLOW_LABEL",
    "ManifestError",
    "RunPlan",
    "add_cwd_to_path",
    "check_input",
    "is_manifest",
    "plan_entrypoint",
    "plan_manifest",
]
