"""A finished run: its final status written once, its Sandbox let go, and ``ttlSecondsAfterFinished``
honoured (the Workflow is deleted then, with everything it owns)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from durable_sandbox.kube.api.resources import WORKFLOWS
from durable_sandbox.kube.holders.holding import Holding
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.reporting.status import TERMINAL_PHASES
from durable_sandbox.kube.spec.plan import RunPlan
from durable_sandbox.kube.workflow.ignored import ignored_fields, ignored_notice
from durable_sandbox.kube.workflow.leftovers import remove_leftovers
from durable_sandbox.kube.workflow.parking import Outcome, wait_or_park
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.wing import Wing

__all__ = ["Finisher", "let_go"]


async def let_go(holding: Holding, view: RunView) -> None:
    """A finished (or deleted) Workflow lets go of the Sandbox it held: the one its spec.sandboxRef names, or
    an entrypoint's ``sandboxRef`` input (both from its spec; releasing one it does not hold does nothing)."""
    if view.released:
        return
    spec = view.latest().get("spec") or {}
    raw = spec.get("input")
    entry_input: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for ref in ((spec.get("sandboxRef") or {}).get("name"), (entry_input.get("sandboxRef") or {}).get("name")):
        if isinstance(ref, str) and ref:
            await holding.release(view.namespace, ref, view.name)
    view.released = True


class Finisher:
    def __init__(self, wing: Wing) -> None:
        self.wing = wing

    async def finished(self, view: RunView, plan: RunPlan) -> Outcome:
        """Write the final status once, then honour ttlSecondsAfterFinished."""
        written = view.body.get("status") or {}
        rendered = self.wing.publisher.status_of(view)
        if view.executing or (written.get("phase"), written.get("observedGeneration")) != (
                rendered.get("phase"), rendered.get("observedGeneration")):
            # The projection was made when this task admitted the run; another replica may have committed
            # the rest of it since (and finished it): fold those rows first (ObservedStore reports the read),
            # or the final status would show an older snapshot as the run's latest.
            await self.wing.engines.engine_for(view.namespace).store.journal_since(view.run_id, view.projection.last_seq)
            self._said_ignored(view, written)
            self.wing.publisher.offer(view)  # not when every replica re-activating a finished Workflow would write it again
            if not view.leftovers_removed:
                # Once, where the end is first seen (not by every replica re-activating a finished Workflow:
                # an inventory per finished run at each start would grow with the history).
                view.leftovers_removed = True
                await remove_leftovers(self.wing, view)
        await let_go(self.wing.holding, view)
        if plan.ttl_seconds_after_finished is None or view.run is None:
            await wait_or_park(self.wing.runs, self.wing.settings, view, None, "finished")
            return "again"
        due = view.run.updated_at + plan.ttl_seconds_after_finished
        if time.time() < due:
            await wait_or_park(self.wing.runs, self.wing.settings, view, due - time.time(), "finished")
            return "again"
        with contextlib.suppress(Exception):
            await self.wing.objects.delete(WORKFLOWS, view.namespace, view.name, uid=view.uid)
        return "done"

    def _said_ignored(self, view: RunView, written: dict[str, Any]) -> None:
        """The spec changed after the final status was written (its generation moved past the one that status
        was written for): what it asked for is not done, and a kubectl patch printed `patched`; say so."""
        shown, generation = written.get("observedGeneration"), view.generation
        phase = written.get("phase")
        if (view.run is None or phase not in TERMINAL_PHASES or not isinstance(shown, int)
                or not isinstance(generation, int) or generation <= shown):
            return
        fields = ignored_fields(view.body.get("spec") or {}, view.run, view.projection.answered)
        view.extra.ignored = ignored_notice(fields, phase, generation)
        reason, message = view.extra.ignored
        self.wing.publisher.emit(view.body, LifecycleEvent(reason, message, "Warning"))
