"""What a run waits for: ``ctx.callback`` (a signal, with an optional deadline) and ``ctx.sleep`` (a durable
timer). A wait that cannot end inline suspends the run (Suspend: status ``waiting``, woken by the signal or
at its deadline or wake time); its started record keeps the payload, deadline or wake time across restarts.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.errors import CallbackTimeout, Suspend
from durable_sandbox.engine.records import ErrorInfo, OperationRecord, OpKind, OpStatus
from durable_sandbox.engine.serialization import to_jsonable, value_digest

if TYPE_CHECKING:
    from durable_sandbox.engine.runtime import RunRuntime

CALLBACK = OpKind.CALLBACK.value
SLEEP = OpKind.SLEEP.value
COMPLETED = OpStatus.COMPLETED.value
FAILED = OpStatus.FAILED.value
STARTED = OpStatus.STARTED.value


async def wait_for_callback(rt: RunRuntime, op_id: str, id: str, payload: Any, timeout: float | None) -> Any:
    """``ctx.callback``: the signal's value, once ``Engine.signal(run_id, op_id, value)`` has delivered it."""
    jpayload = to_jsonable(payload, what=f"The payload of callback {op_id!r}")
    digest = value_digest(jpayload)
    prev = rt.enter(op_id, CALLBACK, id, digest, while_draining=True)
    if prev is not None:
        if prev.status == COMPLETED:
            return prev.result
        if prev.status == FAILED and prev.epoch >= rt.epoch:
            raise rt.recorded_failure(prev)
    if op_id not in rt.signals:
        # A signal may have arrived while this execution was running; look once more before waiting.
        rt.signals.update(await rt.store.get_signals(rt.run_id))
    if op_id in rt.signals:
        value = rt.signals[op_id]
        await rt.write(OperationRecord(op_id, CALLBACK, id, COMPLETED, 1, digest, value, epoch=rt.epoch))
        return value
    deadline = (prev.meta or {}).get("deadline") if prev is not None and prev.status == STARTED else None
    if deadline is None and timeout is not None:
        deadline = time.time() + timeout
    if deadline is not None and time.time() >= deadline:
        err = CallbackTimeout(op_id, timeout or 0)
        await rt.write(
            OperationRecord(op_id, CALLBACK, id, FAILED, 1, digest, error=ErrorInfo.from_exception(err), epoch=rt.epoch)
        )
        raise err
    if prev is None or prev.status != STARTED:
        await rt.write(
            OperationRecord(
                op_id, CALLBACK, id, STARTED, 1, digest, meta={"payload": jpayload, "deadline": deadline}, epoch=rt.epoch,
            )
        )
    raise Suspend([op_id], deadline)


async def durable_sleep(rt: RunRuntime, op_id: str, id: str, seconds: float) -> None:
    """``ctx.sleep``: inline up to the runtime's inline sleep limit, else the run suspends until its wake time."""
    prev = rt.enter(op_id, SLEEP, id, value_digest(seconds))
    if prev is not None and prev.status == COMPLETED:
        return
    if prev is not None and prev.status == STARTED:
        wake_at = float((prev.meta or {})["wakeAt"])
    else:
        wake_at = time.time() + seconds
        await rt.write(
            OperationRecord(op_id, SLEEP, id, STARTED, 1, value_digest(seconds), meta={"wakeAt": wake_at}, epoch=rt.epoch),
            check_cancel=True,
        )
    remaining = wake_at - time.time()
    if remaining > rt.inline_sleep_limit:
        raise Suspend([op_id], wake_at)
    if remaining > 0:
        await asyncio.sleep(remaining)
    await rt.write(OperationRecord(op_id, SLEEP, id, COMPLETED, 1, value_digest(seconds), epoch=rt.epoch))
