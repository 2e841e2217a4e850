"""A run's timeline: journal rows and run events folded into items on lanes, for the run page.

One item per *segment* of an operation (each attempt of a step is its own segment, a retry's backoff is
one too), per run event (signals received, the run starting, waiting, being handed over for a suspend,
sandbox loss notices, progress), per Kubernetes Event of the Workflow (``--kube``), and per call that a
recovery replayed into the replacement sandbox (the journal lists those in the restore's completed
record; they are marked ``replayed`` and point at the call they reproduce). Parallel branches get lanes
of their own (``<parallel op id>/<branch key>``, nested branches nest), so the page can draw them side
by side.

The fold is incremental: :meth:`Timeline.feed` takes rows and events in commit order and returns the
items it created or changed, which is what the page's live updates send.

A Sandbox's own session calls (``session``) are folded the same way: each call also carries the operation id its
caller gave; a rebuild (``rebuild/<sandbox>``, sessions/rebuild.py) is a restore whose replayed calls follow it;
and only the newest ``cap`` items are kept (a session may go on for days), the older ones counted in ``omitted``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any, Final

from durable_sandbox.engine.records import Event, OperationRecord
from durable_sandbox.engine.wording import counted
from durable_sandbox.sandboxes import journal
from durable_sandbox.sandboxes.journal import call_target, read_only
from durable_sandbox.ui.event_labels import STOPPED, event_view
from durable_sandbox.ui.row_labels import (
    CALLBACK,
    PARALLEL,
    SANDBOX_CALL,
    SANDBOX_DESTROY,
    SANDBOX_INJECT_LOSS,
    SANDBOX_RESTORE,
    SLEEP,
    STEP,
    rewind_note,
    row_kind,
    row_label,
)
from durable_sandbox.ui.timeline_cap import ItemCap

__all__ = ["Item", "Lane", "Timeline", "session_of"]

# Kubernetes Event reasons that are a suspend or a resume (kube/workflow/controller.py emits them).
# (A Sandbox's controller emits the rest: its calls' journal holds none of its steps.)
_K8S_KINDS: Final[Mapping[str, str]] = {"Suspended": "suspend", "Resumed": "resume", "SandboxLost": "lost", "Recovered": "restore",
                                        "IdleSuspended": "suspend", "Provisioned": "provision", "SnapshotTaken": "snapshot",
                                        "SnapshotDeleted": "snapshot-delete"}


@dataclass(slots=True)
class Lane:
    id: str  # the op id prefix of the branch ("" for the run itself)
    label: str
    parent: int  # index of the enclosing lane (-1 for the run)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "parent": self.parent}


@dataclass(slots=True)
class Item:
    key: str
    kind: str  # step, call, snapshot, loss, restore, signal, run, suspend, ... (CSS class on the page)
    label: str
    lane: int
    t0: float
    t1: float | None
    outcome: str  # ok, nonzero, failed, retrying, running, waiting, replayed, interrupted, info, warning
    seq: float  # commit order, to order items that share a timestamp
    src: int = 0  # 0 journal, 1 run event, 2 Kubernetes Event: the tie-break after time
    op: str | None = None
    attempt: int = 1
    epoch: int = 0
    exit: int | None = None
    note: str | None = None
    of: str | None = None  # a replayed call: the key of the item of the call it reproduces
    rerun: bool = False  # the same attempt run again after an interruption ended its segment before
    oid: str | None = None  # a session call's operation id, as its caller gave it
    version: int = 0

    def to_json(self, base: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "k": self.key, "c": self.kind, "l": self.label, "n": self.lane, "o": self.outcome,
            "t0": round((self.t0 - base) * 1000, 1), "t1": None if self.t1 is None else round((self.t1 - base) * 1000, 1),
            "s": self.seq, "r": self.src,
        }  # fmt: skip
        if self.op is not None and self.op != self.key:  # (the page reads a missing op of a journal item as its key)
            out["op"] = self.op
        if self.attempt != 1:
            out["a"] = self.attempt
        if self.exit is not None:
            out["x"] = self.exit
        if self.note:
            out["note"] = self.note
        if self.of is not None:
            out["of"] = self.of
        if self.rerun:
            out["ra"] = 1
        if self.oid is not None:
            out["id"] = self.oid
        return out


def _time(record: OperationRecord | Event) -> float:
    return record.ts


def session_of(op_id: str, kind: str, meta: dict[str, Any] | None = None) -> str | None:
    """The sandbox session (``ctx.sandbox`` id, with its scope) an operation of kind ``kind`` belongs to
    (sandboxes/journal.py says how its records are named)."""
    return journal.session_of(OperationRecord(op_id, kind, "", "", meta=meta))


@dataclass
class Timeline:
    """The items of one run, built incrementally from its journal rows and events."""

    base: float  # the run's creation time: item times are shown relative to it
    lanes: list[Lane] = field(default_factory=lambda: [Lane("", "run", -1)])
    items: dict[str, Item] = field(default_factory=dict)
    version: int = 0
    op_seq: int = 0  # the newest journal seq folded
    ev_seq: int = 0  # the newest run event seq folded
    _prefix_lane: dict[str, int] = field(default_factory=dict)
    _open: dict[str, Item] = field(default_factory=dict)  # op id -> its segment not finished yet
    _segments: dict[str, int] = field(default_factory=dict)  # op id -> segments made
    _calls: dict[str, Item] = field(default_factory=dict)  # call op id -> its newest finished segment
    _targets: dict[str, str] = field(default_factory=dict)  # call op id -> its label (from the started record)
    _phase_ts: dict[str, float] = field(default_factory=dict)  # restore op id -> time of its newest started row
    _backoff: dict[str, Item] = field(default_factory=dict)  # op id -> the backoff before its next attempt
    _interrupted: dict[str, Item] = field(default_factory=dict)  # op id -> its segment an interruption ended
    _changed: list[Item] = field(default_factory=list)
    _last_ts: float = 0.0  # the newest time folded: the last sign of life before a worker's crash
    _stopped: bool = True  # the newest run event said the run stopped executing (or none came yet)
    session: bool = False  # a Sandbox's own calls: each call item carries its caller's operation id
    cap: InitVar[int | None] = None  # keep only the newest items (None: all of them)
    capped: ItemCap | None = field(default=None, init=False)
    _oids: dict[str, str] = field(default_factory=dict)  # a session call's operation id -> its op id

    def __post_init__(self, cap: int | None) -> None:
        self.capped = ItemCap(cap) if cap is not None else None

    # ------------------------------------------------------------------ feeding

    def feed(self, rows: Iterable[OperationRecord] = (), events: Iterable[Event] = (),
             k8s_events: Iterable[dict[str, Any]] = ()) -> list[Item]:
        """Fold new rows and events; returns the items created or changed (each once). Rows and run events are
        folded in time order (each in its own commit order), so an interruption ends what was in flight then."""
        self.version += 1
        self._changed = []
        sources: list[Iterable[OperationRecord | Event]] = [rows, events]
        for record in heapq.merge(*sources, key=_time):
            if isinstance(record, Event):
                if record.seq and record.seq <= self.ev_seq:
                    continue
                self.ev_seq = max(self.ev_seq, record.seq)
                self._event(record)
            else:
                if record.seq and record.seq <= self.op_seq:
                    continue
                self.op_seq = max(self.op_seq, record.seq)
                self._row(record)
            self._last_ts = max(self._last_ts, record.ts)
        for k8s in k8s_events:
            self._k8s_event(k8s)
        if self.capped is not None:
            self.capped.trim(self.items, self.sorted_items)
        seen: set[str] = set()
        out = []
        for item in self._changed:
            if self.items.get(item.key) is item and item.key not in seen:
                seen.add(item.key)
                out.append(item)
        return out

    @property
    def omitted(self) -> int:
        """Items dropped for the cap (0 without one)."""
        return self.capped.omitted if self.capped is not None else 0

    def take_evicted(self) -> set[str]:
        """The op ids of the items dropped since the last call that no kept item has (their records can go)."""
        return self.capped.take_evicted(self.items) if self.capped is not None else set()

    def sorted_items(self, *, progress: bool = True) -> list[Item]:
        items = self.items.values() if progress else (i for i in self.items.values() if i.kind != "progress")
        return sorted(items, key=lambda i: (i.t0, i.src, i.seq))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in self.items.values():
            out[item.kind] = out.get(item.kind, 0) + 1
        return out

    # ------------------------------------------------------------------ lanes

    def lane_of(self, op_id: str) -> int:
        parts = op_id.split("/")
        for n in range(len(parts), 0, -1):
            lane = self._prefix_lane.get("/".join(parts[:n]))
            if lane is not None:
                return lane
        return 0

    def _branch(self, prefix: str, label: str, parent: int) -> None:
        if prefix not in self._prefix_lane:
            self._prefix_lane[prefix] = len(self.lanes)
            self.lanes.append(Lane(prefix, label, parent))

    # ------------------------------------------------------------------ journal rows

    def _put(self, item: Item) -> Item:
        item.version = self.version
        self.items[item.key] = item
        self._changed.append(item)
        return item

    def _touch(self, item: Item) -> None:
        item.version = self.version
        self._changed.append(item)

    def _row(self, row: OperationRecord) -> None:
        meta = row.meta or {}
        kind = row.kind
        if kind == PARALLEL and isinstance(meta.get("branches"), list):
            parent = self.lane_of(row.op_id)
            for key in meta["branches"]:
                self._branch(f"{row.op_id}/{key}", str(key), parent)
        if kind == STEP and meta.get("branch"):
            self._branch(row.op_id, row.op_id.rsplit("/", 1)[-1], self.lane_of(row.op_id.rsplit("/", 1)[0]))
        if kind == SANDBOX_CALL and (row.status == "started" or read_only(row)):  # a read-only call: its completion
            target = call_target(row)
            self._targets[row.op_id] = f"{row.name}: {target}" if target is not None else row.name
        if row.status == "started":
            self._started(row)
        else:
            self._finished(row)

    def _started(self, row: OperationRecord) -> None:
        if row.kind == SANDBOX_RESTORE:
            self._phase_ts[row.op_id] = row.ts
        current = self._open.get(row.op_id)
        again = self._interrupted.pop(row.op_id, None)
        if current is not None and current.attempt == row.attempt and current.epoch == row.epoch:
            if row.kind == SANDBOX_RESTORE:  # a restore recording its replacement sandbox: the same segment
                current.label = row_label(row, self._targets)
                self._touch(current)
                return
            # The same attempt started again by the next worker: the one running it stopped (crashed) with no
            # record of its own; it ends at that worker's last sign of life.
            self._interrupt(current, max(current.t0, self._last_ts),
                            "interrupted: the worker running it stopped before it finished (no record of why)")
            again = current
        n = self._segments.get(row.op_id, 0) + 1
        self._segments[row.op_id] = n
        backoff = self._backoff.pop(row.op_id, None)
        if backoff is not None:
            backoff.t1 = row.ts
            self._touch(backoff)
        waiting = row.kind in (CALLBACK, SLEEP)
        item = Item(
            key=row.op_id if n == 1 else f"{row.op_id}#{n}", kind=row_kind(row), label=row_label(row, self._targets),
            lane=self.lane_of(row.op_id), t0=row.ts, t1=None, outcome="waiting" if waiting else "running",
            seq=row.seq, op=row.op_id, attempt=row.attempt, epoch=row.epoch,
        )  # fmt: skip
        meta = row.meta or {}
        if row.kind == SLEEP and isinstance(meta.get("wakeAt"), int | float):
            item.note = f"until +{meta['wakeAt'] - self.base:.1f}s"
        if row.kind == CALLBACK and meta.get("deadline"):
            item.note = f"times out at +{float(meta['deadline']) - self.base:.1f}s"
        if again is not None:
            self._rerun(item, again)
        self._caller_id(item, row)
        self._open[row.op_id] = self._put(item)

    def _caller_id(self, item: Item, row: OperationRecord) -> None:
        if self.session and row.kind == SANDBOX_CALL:
            given = (row.meta or {}).get(journal.META_OPERATION_ID)
            item.oid = given if isinstance(given, str) else None
            if item.oid is not None:
                self._oids[item.oid] = row.op_id

    def _rerun(self, item: Item, interrupted: Item) -> None:
        if (item.attempt, item.epoch) == (interrupted.attempt, interrupted.epoch):
            item.rerun = True
            item.note = f"attempt {item.attempt} run again: the run was interrupted at +{(interrupted.t1 or interrupted.t0) - self.base:.1f}s"

    def _interrupt(self, item: Item, at: float, why: str) -> None:
        """End ``item`` (in flight) at ``at``: its run stopped there; a start of the same attempt is a new segment."""
        self._open.pop(item.op or item.key, None)
        self._interrupted[item.op or item.key] = item
        item.t1, item.outcome, item.note = at, "interrupted", why
        self._touch(item)

    def _interrupt_all(self, at: float, why: str) -> None:
        for item in [i for i in self._open.values() if i.outcome == "running" and i.t0 <= at]:
            self._interrupt(item, at, why)

    def _finished(self, row: OperationRecord) -> None:
        meta = row.meta or {}
        item = self._open.pop(row.op_id, None)
        if item is None:
            # Finished with no start of its own: a cache hit, a branch's closing record, a callback whose
            # signal was there already, a finalize, a patch marker: an instant. Or an interrupted call run
            # again (its started record stands for both runs): from the newest record before it.
            again = self._interrupted.pop(row.op_id, None)
            n = self._segments.get(row.op_id, 0) + 1
            self._segments[row.op_id] = n
            t0 = row.ts if again is None else min(max(again.t1 or again.t0, self._last_ts), row.ts)
            item = Item(
                key=row.op_id if n == 1 else f"{row.op_id}#{n}", kind=row_kind(row), label=row_label(row, self._targets),
                lane=self.lane_of(row.op_id), t0=t0, t1=row.ts, outcome="ok", seq=row.seq, op=row.op_id,
                attempt=row.attempt, epoch=row.epoch,
            )  # fmt: skip
            if again is not None:
                self._rerun(item, again)
            self._caller_id(item, row)
            self._put(item)
        else:
            item.t1 = row.ts
            item.label = row_label(row, self._targets)
            self._touch(item)
        item.outcome = "ok"
        if row.status == "failed":
            item.outcome = "retrying" if meta.get("nextAttemptAt") is not None else "failed"
            if row.error is not None:
                item.note = f"{row.error.type}: {row.error.message}"[:300]
        if row.kind == SANDBOX_CALL and row.status == "completed" and isinstance(row.result, dict):
            code = row.result.get("exitCode")
            if isinstance(code, int):
                item.exit = code
                if code != 0:
                    item.outcome = "nonzero"
            self._calls[row.op_id] = item
        if meta.get("cache") == "hit":
            item.note = "cache hit"
        if row.kind == SANDBOX_INJECT_LOSS or (row.kind == SANDBOX_DESTROY and journal.reason(row) == journal.REASON_LOST):
            item.outcome = "warning"
        if row.status == "failed" and meta.get("nextAttemptAt") is not None:
            self._backoff[row.op_id] = self._put(Item(
                key=f"{item.key}~backoff", kind="backoff", label=f"backoff before attempt {row.attempt + 1}",
                lane=item.lane, t0=row.ts, t1=float(meta["nextAttemptAt"]), outcome="waiting", seq=row.seq + 0.5,
                op=row.op_id, attempt=row.attempt, epoch=row.epoch,
            ))  # fmt: skip
        if row.kind == SANDBOX_RESTORE and row.status == "completed":
            self._replayed(row, item)

    def _replayed(self, row: OperationRecord, restore: Item) -> None:
        if (note := rewind_note(row)) is not None:  # a Sandbox's session rewound: nothing replayed by this record
            restore.note = note
            return
        rebuild = journal.rebuilt(row)  # a Sandbox's session calls replayed into its replacement sandbox
        replayed = ([self._oids.get(oid, oid) for oid in rebuild.replayed] if rebuild else
                    [op for op in journal.replayed(row) if isinstance(op, str)])
        restore.note = f"replayed {counted(len(replayed), 'call')} into the new sandbox"
        if rebuild is not None:
            restore.note = (f"replayed {counted(len(replayed), 'call')} into sandbox {rebuild.sandbox} (it held the "
                            f"first {rebuild.held} of {rebuild.count}; calls journaled onReplay: skip are not run again)")
        if skipped := journal.skipped(row):  # onReplay: skip (or asked, answered skip): not executed again
            restore.note += f"; skipped {', '.join(skipped)} (the journaled result stands)"
        if asked := journal.asked(row):
            restore.note += "; asked about " + ", ".join(f"{op} ({answer})" for op, answer in asked.items())
        if not replayed:
            return
        start = self._phase_ts.get(row.op_id, restore.t0)
        span = max(row.ts - start, 0.0) / len(replayed)
        for i, op in enumerate(replayed):
            original = self._calls.get(op)
            self._put(Item(
                key=f"{row.op_id}>{op}", kind="call", label=original.label if original else self._targets.get(op, op),
                lane=restore.lane, t0=start + i * span, t1=start + (i + 1) * span, outcome="replayed",
                seq=row.seq - 1 + (i + 1) / (len(replayed) + 1), op=op, exit=original.exit if original else None,
                note=f"replayed by {row.op_id}: same op id, outcome checked against the journal",
                of=original.key if original else None,
                oid=(original.oid if original else op.rsplit("/", 1)[-1]) if self.session else None,
            ))  # fmt: skip

    # ------------------------------------------------------------------ events

    def _event(self, event: Event) -> None:
        data = event.data or {}
        etype = event.type
        kind, label, outcome = event_view(event)
        lane = 0
        if etype == "progress" and isinstance(data.get("scope"), str):
            lane = self.lane_of(data["scope"].rstrip("/"))
        if etype == "run.interrupted":  # Ctrl-C, SIGTERM: what was in flight stops here, runs again on resume
            self._interrupt_all(event.ts, "interrupted: the run was stopped (Ctrl-C or a shutdown) while this "
                                          "ran; it runs again when the run is resumed")
        elif etype in ("run.resumed", "run.started") and not self._stopped:
            # A worker starts it while the last one never said it stopped (no waiting, no hand-over, no
            # interruption): that one died, and what it left in flight ended with its last record.
            self._interrupt_all(self._last_ts, "interrupted: the worker running it stopped before it "
                                               "finished (no record of why)")
        if etype.startswith("run."):
            self._stopped = etype in STOPPED
        if isinstance(data.get("session"), str):
            lane = self.lane_of(data["session"])
        self._put(Item(key=f"e{event.seq}", kind=kind, label=label[:400], lane=lane, t0=event.ts, t1=None,
                       outcome=outcome, seq=event.seq, src=1))

    def _k8s_event(self, ev: dict[str, Any]) -> None:
        """A Kubernetes Event of the Workflow (``{uid, ts, reason, message, type, count}``)."""
        key = f"k8s:{ev.get('uid')}"
        reason = str(ev.get("reason") or "")
        label = f"{reason}: {ev.get('message') or ''}"[:400]
        count = int(ev.get("count") or 1)
        if count > 1:
            label += f" (x{count})"
        known = self.items.get(key)
        if (known is not None and known.label == label) or (self.capped is not None and key in self.capped.gone):
            return
        self._put(Item(key=key, kind=_K8S_KINDS.get(reason, "k8s"), label=label, lane=0, t0=float(ev["ts"]), t1=None,
                       outcome="warning" if ev.get("type") == "Warning" else "info", seq=0, src=2))
