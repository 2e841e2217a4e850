"""Saying on the Workflow that its run is held at a journal write the store refuses (engine/refusals.py).

The run stays at the boundary with its completed call in memory and offers the write again with a backoff; the
Workflow shows it where people look: Ready=False with reason ``JournalWriteRefused`` and a message naming the
refusal, what to do and how often it was tried, one Warning Event per distinct refusal (not one per attempt), and
a Normal ``JournalWriteAccepted`` Event once the write is taken and the run goes on.
"""

from __future__ import annotations

from durable_sandbox.engine.errors import StoreRefused
from durable_sandbox.engine.refusals import RefusalHold
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.workflow.publishing import Publisher
from durable_sandbox.kube.workflow.runs import Runs

__all__ = ["REFUSED_REASON", "RefusalNotices", "refusal_hold"]

REFUSED_REASON = "JournalWriteRefused"
HELD = ("The run is held at this boundary with its completed work kept in memory: nothing is executed again "
        "meanwhile, and the write is offered again until it is taken")


class RefusalNotices:
    """The operator's :class:`~durable_sandbox.engine.refusals.RefusalWatcher`: each held run said on its Workflow."""

    def __init__(self, runs: Runs, publisher: Publisher) -> None:
        self.runs = runs
        self.publisher = publisher
        self._said: dict[str, str] = {}  # run id -> the refusal its Warning Event said

    def held(self, run_id: str, refusal: StoreRefused, attempt: int, retry_in: float) -> None:
        view = self.runs.views.get(run_id)
        if view is None:
            return
        text = str(refusal)
        if self._said.get(run_id) != text:
            self._said[run_id] = text
            self.publisher.emit(view.body, LifecycleEvent(REFUSED_REASON, f"{text} {HELD}."[:1024], "Warning"))
        tried = "once" if attempt == 1 else f"{attempt} times"
        view.extra.not_runnable = f"{text} {HELD} (refused {tried}; next try in {retry_in:.0f}s)."
        view.extra.not_runnable_reason = REFUSED_REASON
        self.publisher.offer(view)

    def lifted(self, run_id: str, attempts: int) -> None:
        self._said.pop(run_id, None)
        view = self.runs.views.get(run_id)
        if view is None:
            return
        if view.extra.not_runnable_reason == REFUSED_REASON:
            view.extra.not_runnable, view.extra.not_runnable_reason = None, None
        tried = "once" if attempts == 1 else f"{attempts} times"
        self.publisher.emit(view.body, LifecycleEvent(
            "JournalWriteAccepted", f"the journal write refused {tried} was taken; the run goes on"))
        self.publisher.offer(view)


def refusal_hold(runs: Runs, publisher: Publisher) -> RefusalHold:
    """The engine extension that holds the operator's runs at a refused write and says so on their Workflows."""
    return RefusalHold(watcher=RefusalNotices(runs, publisher))
