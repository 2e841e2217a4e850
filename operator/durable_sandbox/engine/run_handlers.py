"""Query and update handlers a workflow registers (``ctx.query_handler``, ``ctx.update_handler``), and the
replay of the updates its journal records.

Handlers are plain (synchronous) functions over the workflow's in-memory state, usually closures over the
workflow function's locals. A query handler reads that state; an update handler changes it and returns a
value. Neither runs an operation: an update is one journal record of its own (kind ``update``, op id
``update:<update id>``, the validated input in its meta and the handler's result), written by
engine/updates.py, never by workflow code.

Replaying updates: before an operation returns, every update committed before that operation completed has
been applied, in commit order (``catch_up``); at an operation that has not completed (where the run goes on
from, or where a read-only replay stops) every recorded update has been. Updates are committed only while
the run does not execute (the updater holds the run's lease), so the first execution and every replay apply
the same updates at the same points.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from durable_sandbox.engine.errors import NonDeterminismError, UpdateRefused
from durable_sandbox.engine.inputs import InputParameter, describe_mismatch, input_parameter
from durable_sandbox.engine.records import OperationRecord, OpKind, OpStatus

UPDATE = OpKind.UPDATE.value
UPDATE_PREFIX = "update:"
Validator = Callable[[Any], Any]


def update_op_id(update_id: str) -> str:
    """The journal op id of update ``update_id``."""
    return UPDATE_PREFIX + update_id


@dataclass(frozen=True)
class Handler:
    """One registered handler: its function, how its argument is checked, and an optional validator (it raises,
    returns False, or returns the reason as a string, to refuse)."""

    name: str
    fn: Callable[..., Any]
    param: InputParameter | None  # None: the handler takes no argument
    validator: Validator | None = None

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any], validator: Validator | None = None) -> Handler:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(f"Handler {name!r} ({fn.__qualname__}) must be a plain function, not `async def`: "
                            f"handlers read and change the workflow's state, they run no operation.")
        params = list(inspect.signature(fn).parameters.values())
        if len(params) > 1:
            raise TypeError(f"Handler {name!r} ({fn.__qualname__}) takes at most one argument (its input).")
        return cls(name, fn, input_parameter(fn, params[0]) if params else None, validator)

    def prepare(self, raw: Any, what: str) -> Any:
        """The argument the handler is called with, validated; ``UpdateRefused`` saying why when it does not fit."""
        if self.param is None:
            if raw is not None:
                raise UpdateRefused(f"{what} takes no input, but {raw!r} was given; send none.")
            value = None
        else:
            try:
                value = raw if self.param.adapter is None else self.param.adapter.validate_python(raw)
            except ValidationError as exc:
                raise UpdateRefused(f"{what}: {describe_mismatch(exc, raw, self.param.label)}") from None
        if self.validator is not None:
            try:
                verdict = self.validator(value)
            except Exception as exc:
                raise UpdateRefused(f"{what} was refused by its validator: {exc}") from None
            if verdict is False:
                raise UpdateRefused(f"{what} was refused by its validator (it returned False).")
            if isinstance(verdict, str):  # the reason, as a validator may say it
                raise UpdateRefused(f"{what} was refused by its validator: {verdict}")
        return value

    def call(self, value: Any) -> Any:
        return self.fn() if self.param is None else self.fn(value)


class RunHandlers:
    """The handlers registered by one execution (or read-only replay) of a run, and the recorded updates it
    has yet to apply."""

    def __init__(self, rows: list[OperationRecord]) -> None:
        self.queries: dict[str, Handler] = {}
        self.updates: dict[str, Handler] = {}
        self._recorded = [r for r in rows if r.kind == UPDATE and r.status == OpStatus.COMPLETED.value]
        self._applied = 0

    def register_query(self, name: str, fn: Callable[..., Any]) -> None:
        self.queries[name] = Handler.of(name, fn)

    def register_update(self, name: str, fn: Callable[..., Any], validator: Validator | None) -> None:
        self.updates[name] = Handler.of(name, fn, validator)

    @property
    def behind(self) -> bool:
        """True while recorded updates wait to be applied (the step path checks this first: most runs have none)."""
        return self._applied < len(self._recorded)

    def catch_up(self, before_seq: int | None) -> None:
        """Apply the recorded updates committed before ``before_seq`` (None: all of them), in commit order;
        stops at one whose handler is not registered yet (a later operation applies it once it is)."""
        while self._applied < len(self._recorded):
            rec = self._recorded[self._applied]
            if before_seq is not None and rec.seq >= before_seq:
                return
            handler = self.updates.get(rec.name)
            if handler is None:
                return
            self._applied += 1
            value = (rec.meta or {}).get("input")
            try:
                handler.call(handler.prepare(value, f"Update {rec.name!r}"))
            except Exception as exc:
                raise NonDeterminismError(
                    rec.op_id,
                    {"kind": UPDATE, "name": rec.name, "outcome": "applied"},
                    {"kind": UPDATE, "name": rec.name, "outcome": f"{type(exc).__name__}: {exc}"},
                ) from exc

    def unapplied(self) -> list[str]:
        """Names of recorded updates not applied yet (their handler never registered)."""
        return [r.name for r in self._recorded[self._applied:]]

    def recorded(self, record: OperationRecord) -> None:
        """``record`` (an update just committed by this process) is applied already: count it as such."""
        self._recorded.append(record)
        self._applied = len(self._recorded)
