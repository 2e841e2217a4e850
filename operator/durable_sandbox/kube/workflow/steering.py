"""Steering: what the user writes in a Workflow's spec while its run goes (``spec.signals``, ``spec.cancel``)
brought to the run in the store; idempotent, so every turn (and every replica) may do it."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from durable_sandbox.engine import SignalConflict
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.spec.models import WorkflowResource, without_refused_signals
from durable_sandbox.kube.workflow.publishing import Publisher
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.sandbox_engine import Engine

__all__ = ["sync_spec"]

_MISSING = object()


async def sync_spec(view: RunView, engine: Engine, publisher: Publisher) -> WorkflowResource | None:
    """Bring spec.signals and spec.cancel to the run (a signal is stored once); the spec as validated, or
    None when it is invalid (admission has said why)."""
    body, refused = without_refused_signals(dict(view.body))
    for key, problem in refused.items():
        if view.extra.refused_signals.get(key) != problem:
            publisher.emit(view.body, LifecycleEvent("SignalRefused", f"spec.signals.{key}: {problem}"[:1024], "Warning"))
    if refused != view.extra.refused_signals:
        view.extra.refused_signals = refused
        publisher.offer(view)
    try:
        wf = WorkflowResource.model_validate(body)
    except ValidationError:
        return None
    signals: dict[str, Any] = wf.spec.signals
    for callback_id, value in signals.items():
        if view.signals_sent.get(callback_id, _MISSING) == value:
            continue
        try:
            await engine.client.signal(view.run_id, callback_id, value)
        except SignalConflict as exc:
            publisher.emit(view.body, LifecycleEvent("SignalConflict", str(exc)[:1024], "Warning"))
        view.signals_sent[callback_id] = value
    if wf.spec.cancel and not view.cancel_sent:
        await engine.client.request_cancel(view.run_id, "spec.cancel is true")
        view.cancel_sent = True
    return wf
