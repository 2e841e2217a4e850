"""The Sandbox's record and status: what the controller acts on is recorded first (the Sandbox's sealed record,
``kube/journal/sandbox_records.py``), then shown in status (merge patches through the status subresource, one write per
transition); conditions, Events and the lifecycle log."""

from __future__ import annotations

import logging
from typing import Any

from durable_sandbox.kube.api.resources import SANDBOXES
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.reporting.oplog import LIFECYCLE_LOGGER, about
from durable_sandbox.kube.sandbox.base import CONDITION_ORDER, STEPS, SandboxBase
from durable_sandbox.kube.sandbox.idle import IdlePlan
from durable_sandbox.kube.sandbox.view import SandboxView
from durable_sandbox.kube.spec.conditions import State, find, merge, rfc3339

log = logging.getLogger("durable_sandbox.kube.sandbox.controller")
lifecycle = logging.getLogger(LIFECYCLE_LOGGER)

__all__ = ["SandboxStatus"]


class SandboxStatus(SandboxBase):
    """Records, status, conditions and Events of a Sandbox."""

    async def _patch(self, view: SandboxView, changes: dict[str, Any]) -> None:
        """Record ``changes`` (None deletes) that the controller acts on in the Sandbox's record, then show them
        all in status (merge patch), and keep them as what we know."""
        changes = {**changes, "observedGeneration": view.generation}
        await self._record(view, changes)  # (the record keeps only its own fields of them)
        await self.objects.patch_status(SANDBOXES, view.namespace, view.name, changes)

    @staticmethod
    def _conditions(view: SandboxView, **states: State) -> list[dict[str, Any]]:
        """The conditions with ``states`` (type -> (on, reason, message)) applied over the current ones."""
        return merge(view.status.get("conditions") or [], states, view.generation, CONDITION_ORDER)

    async def _transition(self, view: SandboxView, phase: str, changes: dict[str, Any] | None = None,
                          **states: State) -> None:
        await self._patch(view, {**(changes or {}), "phase": phase, "conditions": self._conditions(view, **states)})

    async def _emit(self, view: SandboxView, reason: str, message: str, kind: str = "Normal") -> None:
        if reason in STEPS:
            lifecycle.info("%s/%s (Sandbox): %s: %s", view.namespace, view.name, reason, message,
                           extra=about(view.namespace))
        await self.events.emit(dict(view.latest()), LifecycleEvent(reason, message[:1024], kind))

    async def _record(self, view: SandboxView, changes: dict[str, Any]) -> None:
        """Record ``changes`` that the controller acts on (None deletes) and keep them as what we know; status
        shows only what :meth:`_patch` writes."""
        for key, value in changes.items():
            if value is None:
                view.status.pop(key, None)
            else:
                view.status[key] = value
        await self.records.write(view.namespace, view.name, view.uid, changes)

    async def _show_state(self, view: SandboxView, plan: IdlePlan) -> None:
        """``status.state`` and ``status.stateSince`` (the State and Since columns), written when they change."""
        shown = {"state": plan.state, "stateSince": rfc3339(plan.since)}
        if any(view.status.get(key) != value for key, value in shown.items()):
            await self._patch(view, shown)

    @staticmethod
    def _condition(view: SandboxView, ctype: str) -> dict[str, Any] | None:
        return find(view.status.get("conditions") or [], ctype)
