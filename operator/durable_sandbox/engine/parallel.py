"""``ctx.parallel``: a fan-out of branches, each checkpointed on its own under ``<id>/<key>``, and the join.

The protocol: the parallel's start record (its branch keys), the branches under an optional concurrency bound
(a plain callable runs as one ``ctx.step``, ``async def branch(ctx)`` in a child context with its own scoped
operations and a completion record of its own), then the join: every failure named (ParallelError), or the
waits of suspended branches merged into one Suspend, or the result committed once. A replayed parallel
returns its recorded result without entering its branches again.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from durable_sandbox.engine.errors import ParallelError, Suspend
from durable_sandbox.engine.policies import RetryPolicy
from durable_sandbox.engine.records import OperationRecord, OpKind, OpStatus
from durable_sandbox.engine.serialization import callable_name, revalidate, to_jsonable, value_digest

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime

PARALLEL = OpKind.PARALLEL.value
STEP = OpKind.STEP.value
COMPLETED = OpStatus.COMPLETED.value
STARTED = OpStatus.STARTED.value

Branch = Callable[..., Any]


class BranchingContext(Protocol):
    """What a parallel needs of the context it runs in: its run, its scope, its ``step`` (a plain branch is one,
    traced as any step) and a child context per branch."""

    @property
    def operations(self) -> RunRuntime: ...

    @property
    def scope(self) -> str: ...

    def step(self, id: str, /, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]: ...

    def child(self, scope: str) -> Any: ...


def takes_context(fn: Branch, context_type: type) -> bool:
    """A parallel branch that takes one parameter named ``ctx`` (or annotated Context) gets a child context."""
    target = fn.func if isinstance(fn, partial) else fn
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    if len(params) != 1:
        return False
    ann = params[0].annotation
    return params[0].name == "ctx" or ann is context_type or ann == context_type.__name__ or (
        isinstance(ann, str) and ann.endswith(f".{context_type.__name__}")
    ) or getattr(target, "__durable_branch__", False)


def branch_items(op_id: str, branches: Mapping[str, Branch] | Sequence[Branch]) -> list[tuple[str, Branch]]:
    """The branches as (key, branch): a mapping's keys, or a sequence's indexes; a key is one id segment."""
    items = ([(str(k), b) for k, b in branches.items()] if isinstance(branches, Mapping)
             else [(str(i), b) for i, b in enumerate(branches)])
    for key, _ in items:
        if not key or "/" in key:
            raise ValueError(f"Parallel {op_id!r}: branch key {key!r} must be non-empty and contain no '/'.")
    return items


async def run_parallel(
    ctx: BranchingContext,
    id: str,
    branches: Mapping[str, Branch] | Sequence[Branch],
    *,
    max_concurrency: int | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
) -> Any:
    """``ctx.parallel``: the branches' values as a list or dict matching ``branches`` (see the module's doc)."""
    rt = ctx.operations
    op_id = ctx.scope + id
    as_list = not isinstance(branches, Mapping)
    items = branch_items(op_id, branches)
    keys = [k for k, _ in items]
    prev = rt.enter(op_id, PARALLEL, id, value_digest(keys))
    if prev is not None and prev.status == COMPLETED:
        return revalidate_branches(items, prev.result, as_list)
    if prev is None:
        await rt.write(
            OperationRecord(op_id, PARALLEL, id, STARTED, 1, value_digest(keys), meta={"branches": keys}, epoch=rt.epoch),
            check_cancel=True,
        )
    gate: Any = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    context_type = type(ctx)

    async def run_branch(key: str, branch: Branch) -> Any:
        async with gate if gate is not None else nullcontext():
            if not takes_context(branch, context_type):
                return await ctx.step(f"{id}/{key}", branch, retry=retry, timeout=timeout)
            return await _run_scoped_branch(ctx, f"{op_id}/{key}", f"{id}/{key}", branch)

    outcomes = await asyncio.gather(*(run_branch(k, b) for k, b in items), return_exceptions=True)
    values = _join(op_id, keys, outcomes)
    result: Any = values if as_list else dict(zip(keys, values, strict=True))
    await rt.write(
        OperationRecord(
            op_id, PARALLEL, id, COMPLETED, 1, value_digest(keys),
            to_jsonable(result, what=f"The result of parallel {op_id!r}"), epoch=rt.epoch,
        )
    )
    return result


async def _run_scoped_branch(ctx: BranchingContext, bop: str, scope: str, branch: Branch) -> Any:
    """``async def branch(ctx)``: run in a child context scoped ``<parallel id>/<key>/``, its value recorded."""
    rt = ctx.operations
    bname = callable_name(branch)
    done = rt.enter(bop, STEP, bname, None)
    if done is not None and done.status == COMPLETED:
        return revalidate(branch, done.result)
    value = await branch(ctx.child(scope))
    await rt.write(
        OperationRecord(
            bop, STEP, bname, COMPLETED, 1, None,
            to_jsonable(value, what=f"The result of branch {bop!r}"), meta={"branch": True}, epoch=rt.epoch,
        ),
        boundary=True,
    )
    return value


def _join(op_id: str, keys: list[str], outcomes: list[Any]) -> list[Any]:
    """The branches' values, in order; ParallelError naming every failed key, or one Suspend for all waits."""
    failures: dict[str, Exception] = {}
    waiting: list[Suspend] = []
    for key, outcome in zip(keys, outcomes, strict=True):
        if isinstance(outcome, Suspend):
            waiting.append(outcome)
        elif isinstance(outcome, Exception):
            failures[key] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
    if failures:
        raise ParallelError(op_id, failures)
    if waiting:
        raise Suspend(
            [i for s in waiting for i in s.op_ids],
            min((s.wake_at for s in waiting if s.wake_at is not None), default=None),
        )
    return outcomes


def revalidate_branches(items: list[tuple[str, Branch]], recorded: Any, as_list: bool) -> Any:
    """A replayed parallel's result, each branch's value revalidated through that branch's return
    annotation: the same rule as ``ctx.step``, so a branch returning a pydantic model gives the model
    on replay too, not the JSON it was recorded as."""
    if as_list and isinstance(recorded, list) and len(recorded) == len(items):
        return [revalidate(branch, value) for (_, branch), value in zip(items, recorded, strict=True)]
    if not as_list and isinstance(recorded, dict):
        return {key: revalidate(branch, recorded[key]) if key in recorded else None for key, branch in items}
    return recorded
