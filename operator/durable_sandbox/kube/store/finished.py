"""Which runs of a namespace have finished, for the orphan sweep (kube/sweep/sweeper.py): decided from the runs'
sealed records, never from a label or annotation of their heads.

A finished run's Workflow references nothing, so the sweep removes what is tagged with it: a head that made a
live run look finished would have the sweep destroy its live sandbox and snapshots. A head's labels and
annotations are anyone's who may write Journal objects (a namespace's worker ServiceAccount may, issue 39), so
they are only a pre-filter of *which heads to read*:

* a run is finished when its head, at the name only the operator computes for its id (``dsb.<run key>``),
  opens with the namespace's key (the seals of the fields read here, status, result and labels, verify:
  ``kube/journal/sealing.py``) and its sealed status is terminal;
* and it did not continue as new (a chain goes on): neither its sealed result names a next run, nor does a
  sealed record of this namespace name it as the run before it, nor is there any head, read or not, of the run
  it would continue as (``next_run_id``). Unverified heads are used only this way, so they can make the sweep
  keep something, never remove it;
* the end of a chain marks the chain's first run (the Workflow's own, what the sweep looks up) finished too,
  only where every link back to it is sealed on both sides (the later run's ``continued-from`` names the earlier
  run, whose result names the later: as ``engine/continue_as_new.py`` follows a chain).

A head whose seals do not verify, that cannot be decoded, that is not at its run's name, or whose status label
disagrees with its sealed status is ignored and listed in :attr:`FinishedRuns.ignored` (the sweep says each once).

What a seal cannot tell apart: the operator and a worker of the same namespace seal with the same namespace key
(kube/journal/worker_key.py; only a namespace with worker Workflows is handed it), so a worker, whose journal is
its team's word, can seal a head of its own namespace that this reader takes as genuine. The sweep therefore
believes this reader, in a namespace whose key was handed to workers, for worker Workflows' runs only
(``OrphanSweeper._believed``).

What a seal cannot stop (kube/journal/sealing.py): the operator's own older value put back under the same key.
A run's status was terminal only once it ended; the one rollback that could make a running chain look ended, a
continued run's result put back to the ``null`` it was created with, is caught by the next run's head existing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine.continue_as_new import CONTINUED_FROM, continued_to, next_run_id
from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, LABEL_RUN
from durable_sandbox.kube.store.codec import ANNOTATION_RUN, LABEL_STATUS, head_name, run_key
from durable_sandbox.kube.store.heads import RunHeads

__all__ = ["FinishedRuns", "finished_keys", "read_finished"]

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class FinishedRuns:
    """The run keys (``run_key``) of a namespace's finished runs, and the heads ignored on the way (name, why)."""

    keys: frozenset[str]
    ignored: tuple[tuple[str, str], ...] = ()


def _first_of(by_id: Mapping[str, RunRecord], end: RunRecord) -> str | None:
    """The first run of the chain ``end`` ends, where every link back to it is sealed on both sides; None when
    ``end`` began no chain or a link does not hold."""
    seen, cur = {end.run_id}, end
    while (before_id := cur.labels.get(CONTINUED_FROM)) is not None:
        before = by_id.get(before_id)
        if before is None or before_id in seen or continued_to(before) != cur.run_id:
            return None
        seen.add(before_id)
        cur = before
    return cur.run_id if cur is not end else None


def finished_keys(runs: Iterable[RunRecord], present: Set[str] = frozenset()) -> frozenset[str]:
    """The run keys of the finished runs among ``runs`` (records read from where only the operator writes:
    sealed, or a namespace's own schema), and of the first run of each finished chain (see the module).
    ``present``: the ids of every run with a head, verified or not (a next run there means the chain goes on)."""
    by_id = {r.run_id: r for r in runs}
    continued = {r.labels[CONTINUED_FROM] for r in by_id.values() if r.labels.get(CONTINUED_FROM)}
    out: set[str] = set()
    for run in by_id.values():
        following = next_run_id(run)
        if (not run.status.terminal or continued_to(run) is not None or run.run_id in continued
                or (following != run.run_id and following in present)):
            continue
        out.add(run_key(run.run_id))
        first = _first_of(by_id, run)
        if first is not None:
            out.add(run_key(first))
    return frozenset(out)


def _claimed_id(meta: Mapping[str, Any]) -> str | None:
    """The run id a head says it is of (unverified: its annotation, else its run label)."""
    value = (meta.get("annotations") or {}).get(ANNOTATION_RUN) or (meta.get("labels") or {}).get(LABEL_RUN)
    return value if isinstance(value, str) and value else None


async def _sealed_run(heads: RunHeads, head: dict[str, Any], run_id: str, name: str) -> RunRecord:
    """The run fields the decision is made from (status, result, labels), each opened (its seal checked):
    :class:`JournalDamaged` when one does not open. A result kept in blob objects (over 16 KiB) is not fetched:
    a continuation's result is a few bytes, so a run whose result is that large did not continue as new."""
    data = head.get("data") or {}
    stored = data.get("run.result")
    result = (None if stored is None
              else heads.opened(run_id, run_key(run_id), "run.result", str(stored), name))
    status, labels = await heads.field(run_id, data, "status", name), await heads.field(run_id, data, "labels", name)
    try:
        return RunRecord(run_id=run_id, workflow="", input=None, status=RunStatus(status),
                         result=None if result is None or result.startswith("@") else json.loads(result),
                         labels=dict(labels or {}))
    except (TypeError, ValueError) as exc:
        raise JournalDamaged(run_id, f"Journal {heads.namespace}/{name}",
                             f"the run record cannot be decoded ({type(exc).__name__}: {exc})", tampered=False) from None


async def _opened(heads: RunHeads, head: dict[str, Any]) -> RunRecord | str:
    """The sealed run record of a head labelled finished, or why it is ignored."""
    meta = head.get("metadata") or {}
    name, run_id = str(meta.get("name")), _claimed_id(meta)
    if run_id is None or name != head_name(run_id):
        return f"it is not the head of run {run_id!r} (that is {head_name(run_id or '')!r}): not made by the operator"
    try:
        run = await _sealed_run(heads, head, run_id, name)
    except JournalDamaged as exc:
        return str(exc)
    label = (meta.get("labels") or {}).get(LABEL_STATUS)
    if run.status.value != label:
        return (f"its status label says {label!r} but its sealed record says {run.status.value!r}: the label was "
                f"changed by someone other than the operator; the run is taken as {run.status.value!r}")
    return run


async def read_finished(heads: RunHeads, items: Sequence[dict[str, Any]] | None = None) -> FinishedRuns:
    """The finished runs of ``heads``' namespace, from their sealed head records (``items``: the namespace's run
    heads, listed here when not given). Only heads labelled finished are opened (the label only chooses what
    to read: one labelled otherwise is taken as not finished, which keeps what its Workflow holds)."""
    if items is None:
        items = await heads.objects.select(f"{LABEL_PART}=run")
    present = {rid for h in items if (rid := _claimed_id(h.get("metadata") or {})) is not None}
    runs: list[RunRecord] = []
    ignored: list[tuple[str, str]] = []
    for head in items:
        meta = head.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_STATUS) not in TERMINAL:
            continue
        opened = await _opened(heads, head)
        if isinstance(opened, str):
            ignored.append((str(meta.get("name")), opened))
        else:
            runs.append(opened)
    return FinishedRuns(finished_keys(runs, present), tuple(ignored))
