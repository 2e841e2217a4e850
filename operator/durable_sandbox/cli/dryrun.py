"""`dsb run --dry-run`: what would run, checked as for a real run, with nothing created or executed."""

from __future__ import annotations

import json
from typing import Any

import click

from durable_sandbox.cli import render
from durable_sandbox.engine import RunRecord
from durable_sandbox.engine.serialization import to_jsonable
from durable_sandbox.kube.spec.plan import RunPlan
from durable_sandbox.runs.settings import Settings


def plan_doc(plan: RunPlan, existing: RunRecord | None) -> dict[str, Any]:
    return {
        "label": plan.label,
        "runId": plan.run_id,
        "workflow": plan.definition.name,
        "input": to_jsonable(plan.input, what="The workflow input"),
        "signals": plan.signals,
        "cancel": plan.cancel,
        "maxAttempts": plan.max_attempts,
        "timeoutSeconds": plan.timeout,
        "warnings": plan.warnings,
        "existingStatus": existing.status.value if existing is not None else None,
    }


def _would(existing: RunRecord | None) -> str:
    if existing is None:
        return "new run"
    status = existing.status.value
    if status in ("succeeded", "cancelled"):
        return f"exists, {status}: would report it, run nothing"
    if status == "failed":
        return "exists, failed: would retry it from its journal"
    return f"exists, {status}: would continue it"


def show(settings: Settings, plans: list[RunPlan], existing: list[RunRecord | None]) -> None:
    docs = [plan_doc(p, e) for p, e in zip(plans, existing, strict=True)]
    if settings.output != "table":
        render.emit_data(settings, docs[0] if len(docs) == 1 else docs)
        return
    for plan, doc, run in zip(plans, docs, existing, strict=True):
        run_id = plan.run_id or "(generated)"
        click.echo(f"{plan.label}: run {run_id} of workflow {plan.definition.name} ({_would(run)})")
        calls = doc["input"].get("toolCalls") if isinstance(doc["input"], dict) else None
        if isinstance(calls, list):
            for index, call in enumerate(calls, 1):
                target = call.get("command") if call.get("type") == "shell" else call.get("path")
                click.echo(f"  {index}. {render.op_label(str(call.get('type')), target)}")
        else:
            click.echo(f"  input: {json.dumps(doc['input'], ensure_ascii=False)}")
        for callback_id in plan.signals:
            click.echo(f"  signal {callback_id} delivered before it starts")
        if plan.cancel:
            click.echo("  spec.cancel: it would be cancelled")
        if plan.max_attempts > 1:
            click.echo(f"  up to {plan.max_attempts} attempts (spec.retry)")
        if plan.timeout is not None:
            click.echo(f"  cancelled after {plan.timeout:g}s (spec.timeoutSeconds)")
    click.echo("dry run: nothing was created or run")
