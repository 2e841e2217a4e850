"""What `dsb run` runs: a manifest's Workflows, or a ``module:function`` / registered workflow.

The meaning of a Workflow spec (run plan, run id, retry, timeout) is :mod:`durable_sandbox.kube.plan`,
shared with the operator; this module reads the target and turns plan errors into CLI errors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from durable_sandbox.cli.errors import CliError
from durable_sandbox.kube import plan
from durable_sandbox.kube.manifests import ManifestError, load_manifests
from durable_sandbox.kube.plan import WORKFLOW_LABEL, RunPlan


def add_cwd_to_path() -> None:
    """Let ``module:function`` resolve from the current directory, as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def is_manifest(target: str) -> bool:
    return target == "-" or target.endswith((".yaml", ".yml", ".json")) or Path(target).is_file()


def plan_entrypoint(target: str, value: Any, run_id: str | None) -> RunPlan:
    try:
        return plan.plan_entrypoint(target, value, run_id)
    except plan.PlanError as exc:
        raise CliError(str(exc)) from exc


def plan_manifest(target: str, run_id: str | None) -> list[RunPlan]:
    if target == "-":
        resources = load_manifests(sys.stdin.read(), source="<stdin>")
        source = "<stdin>"
    else:
        if not Path(target).is_file():
            raise CliError(f"{target}: no such manifest file")
        resources = load_manifests(Path(target))
        source = target
    try:
        return plan.plan_resources(resources, source=source, run_id=run_id)
    except plan.PlanError as exc:
        raise CliError(str(exc)) from exc


__all__ = [
    "WORKFLOW_LABEL",
    "ManifestError",
    "RunPlan",
    "add_cwd_to_path",
    "is_manifest",
    "plan_entrypoint",
    "plan_manifest",
]
