"""``RunState``: the JSON shape of a run for users, `dsb inspect`, and the operator's status."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, computed_field
from pydantic.alias_generators import to_camel

from durable_sandbox.engine.extensions import GENERIC_JOURNAL, JournalReader
from durable_sandbox.engine.records import OperationRecord, OpStatus, RunRecord
from durable_sandbox.engine.replay import supersedes
from durable_sandbox.engine.runtime import pending_callbacks

_COMPLETED = OpStatus.COMPLETED.value
_STARTED = OpStatus.STARTED.value


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


class PendingCallback(_Camel):
    id: str
    payload: Any = None


class OperationState(_Camel):
    op_id: str
    kind: str
    name: str
    status: str
    attempt: int
    input_digest: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    target: str | None = None  # a sandbox call's command or path
    started_at: float | None = None
    finished_at: float | None = None


class RunState(_Camel):
    run_id: str
    workflow: str
    status: str
    attempt: int = 1  # of the run as a whole: 1, then 2 and on for each retry (or resume) of a failed run
    input: Any = None
    result: Any = None
    error: dict[str, Any] | None = None
    pending_callbacks: list[PendingCallback] = Field(default_factory=list)
    thread_id: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    wake_at: float | None = None
    created_at: float
    updated_at: float

    _rows: list[OperationRecord] = PrivateAttr(default_factory=list)
    _reader: JournalReader = PrivateAttr(default=GENERIC_JOURNAL)

    # Built on first use: `run`/`resume` of a long run return at once, and the per-operation view
    # (thousands of objects) is made only for whoever reads it (inspect, serialization). So are the snapshots
    # and recoveries: each folds the whole journal (about 17 µs a call), which a run a chain leaves
    # (ctx.continue_as_new) would otherwise pay at its hand-over for a state nobody reads.
    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def snapshots(self) -> list[str]:
        return self._reader.snapshots(self._rows)

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def recovery_count(self) -> int:
        return self._reader.recoveries(self._rows)

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def operations(self) -> list[OperationState]:
        return operation_states(self._rows, self._reader)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


def fold(rows: Iterable[OperationRecord]) -> tuple[dict[str, OperationRecord], dict[str, OperationRecord]]:
    first: dict[str, OperationRecord] = {}
    latest: dict[str, OperationRecord] = {}
    for r in rows:
        first.setdefault(r.op_id, r)
        prev = latest.get(r.op_id)
        if prev is None or supersedes(prev, r):  # a completion journaled twice: the first stands
            latest[r.op_id] = r
    return first, latest


def operation_states(rows: list[OperationRecord], reader: JournalReader = GENERIC_JOURNAL) -> list[OperationState]:
    first, latest = fold(rows)
    # model_construct: these values come from our own journal, already typed.
    return [
        OperationState.model_construct(
            op_id=op,
            kind=rec.kind,
            name=rec.name,
            status=rec.status,
            attempt=rec.attempt,
            input_digest=rec.input_digest,
            result=rec.result if rec.status == _COMPLETED else None,
            error=rec.error.to_json() if rec.error else None,
            meta=rec.meta,
            target=reader.target(first[op]),
            started_at=first[op].ts,
            finished_at=rec.ts if rec.status != _STARTED else None,
        )
        for op, rec in latest.items()
    ]


def build_state(run: RunRecord, rows: list[OperationRecord], reader: JournalReader = GENERIC_JOURNAL, *,
                callbacks: bool = True) -> RunState:
    """The state of ``run`` from its journal; ``reader`` says what the extensions' records mean (snapshots,
    recoveries, what a call works on). ``callbacks=False``: no pending callbacks (a run that can take no signal
    any more), and the journal is not folded for them."""
    state = RunState(
        run_id=run.run_id,
        workflow=run.workflow,
        status=run.status.value,
        attempt=run.epoch + 1,
        input=run.input,
        result=run.result,
        error=run.error.to_json() if run.error else None,
        pending_callbacks=[PendingCallback(**p) for p in pending_callbacks(fold(rows)[1].values())] if callbacks else [],
        thread_id=run.thread_id,
        labels=dict(run.labels),
        wake_at=run.wake_at,
        created_at=run.created_at,
        updated_at=run.updated_at,
    )
    state._rows = rows
    state._reader = reader
    return state
