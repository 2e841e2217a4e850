"""A Workflow whose run continues as new (``ctx.continue_as_new``, engine/continue_as_new.py) follows its chain:
the Workflow is served by run after run of it, each driven as the Workflow's run until the last ends.

The Workflow's own run (``<name>-<uid[:8]>``, what the scheduler keys it by) starts the chain; when the run the
view is at has ended by continuing as new, the view moves on to the next (:func:`move_on`): ``view.run_id``
becomes the next run's id (status.runId, the journal, execution, leases), the view is found under every id of
the chain (the engine's services and the status projection look runs up by id), and the ended run is kept for
``status.runs`` (kube/reporting/chain_status.py). A link is followed only where the next run's record names the
run before it (``continued-from``, the journal's sealed record: never a label of the Workflow).

After a restart a Workflow's view starts again at the chain's first run and follows it, one turn per link."""

from __future__ import annotations

from typing import Any

from durable_sandbox.engine.continue_as_new import CONTINUED_FROM, continued_to
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.kube.reporting.chain_status import RUNS_SHOWN
from durable_sandbox.kube.reporting.status import Projection
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.kube.workflow.runs import Runs, RunView

__all__ = ["chain_from", "chain_owner", "move_on", "next_in_chain"]


async def next_in_chain(store: Any, run: RunRecord) -> RunRecord | None:
    """The run ``run`` continued as, if it did and that run's record names ``run`` as the one before it."""
    nxt = continued_to(run)
    if nxt is None:
        return None
    following: RunRecord | None = await store.get_run(nxt)
    if following is None or following.labels.get(CONTINUED_FROM) != run.run_id:
        return None
    return following


async def chain_from(store: Any, run: RunRecord) -> list[RunRecord]:
    """``run`` and the runs it continued as, in order (the last: the run the chain is at now)."""
    chain, seen = [run], {run.run_id}
    while chain[-1].status.terminal and (nxt := await next_in_chain(store, chain[-1])) is not None:
        if nxt.run_id in seen:
            break
        seen.add(nxt.run_id)
        chain.append(nxt)
    return chain


def move_on(runs: Runs, view: RunView, ended: RunRecord, nxt: RunRecord) -> None:
    """The view goes on with ``nxt``, the run ``ended`` continued as (see the module)."""
    view.chain.append(ended)
    del view.chain[:-RUNS_SHOWN]  # status.runs shows this many; the journal keeps every run
    # Found under the Workflow's own run id (the scheduler's key) and the run it is at (the services', status').
    first = cluster_run_id(view.name, view.uid)
    runs.views[nxt.run_id] = view
    for kept in (runs.secrets, runs.env_values):
        if view.run_id in kept:
            kept[nxt.run_id] = kept[view.run_id] if view.run_id == first else kept.pop(view.run_id)  # type: ignore
    if view.run_id != first and runs.views.get(view.run_id) is view:
        del runs.views[view.run_id]
    view.run_id = nxt.run_id
    view.run = nxt
    view.projection = Projection()


def chain_owner(runs: Runs, run: RunRecord) -> OwnerRef | None:
    """The Workflow a continuation run belongs to: the one whose view is at the run it continues (its journal
    objects are then collected with that Workflow)."""
    before = run.labels.get(CONTINUED_FROM)
    view = runs.views.get(before) if before else None
    return OwnerRef(name=view.name, uid=view.uid) if view is not None else None
