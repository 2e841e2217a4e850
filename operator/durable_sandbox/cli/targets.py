"""What `dsb run` runs: a manifest's Workflows, or a ``module:function`` / registered workflow.

The meaning of a Workflow spec (run plan, run id, retry, timeout) is :mod:`durable_sandbox.kube.spec.plan`,
shared with the operator; this module reads the target and turns plan errors into CLI errors.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

from durable_sandbox.kube.spec import plan
from durable_sandbox.kube.spec.manifests import ManifestError, load_manifests
from durable_sandbox.kube.spec.plan import WORKFLOW_LABEL, RunPlan
from durable_sandbox.kube.spec.preflight import sandbox_problems
from durable_sandbox.runs.errors import CliError

# Run ids are typed back in commands (`dsb resume ID`): not empty, no whitespace or control characters.
RUN_ID = re.compile(r"^[^\s\x00-\x1f\x7f]{1,253}$")


def check_run_id(run_id: str | None) -> None:
    if run_id is not None and not RUN_ID.match(run_id):
        raise CliError(
            f"--run-id {run_id!r} is not a valid run id: give 1 to 253 characters without spaces or control characters"
        )


def add_cwd_to_path() -> None:
    """Let ``module:function`` resolve from the current directory, as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def is_manifest(target: str) -> bool:
    return target == "-" or target.endswith((".yaml", ".yml", ".json")) or Path(target).is_file()


def plan_entrypoint(target: str, value: Any, run_id: str | None) -> RunPlan:
    check_run_id(run_id)
    try:
        return plan.plan_entrypoint(target, value, run_id)
    except plan.PlanError as exc:
        raise CliError(str(exc)) from exc


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
    try:
        plans = plan.plan_resources(resources, source=source, run_id=run_id)
    except plan.PlanError as exc:
        raise CliError(str(exc)) from exc
    # What only the provider registry can judge (configuration, capabilities), before any run exists.
    problems = [
        f"{p.where}{problem}"
        for p in plans
        if p.sandbox is not None
        for problem in asyncio.run(
            sandbox_problems(p.sandbox, snapshot_every=p.snapshot_every, inject_loss_after=p.inject_loss_after)
        )
    ]
    if problems:
        raise CliError("\n".join(problems))
    return plans


__all__ = [
    "WORKFLOW_LABEL",
    "ManifestError",
    "RunPlan",
    "add_cwd_to_path",
    "is_manifest",
    "plan_entrypoint",
    "plan_manifest",
]
