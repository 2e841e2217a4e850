"""Helpers shared by the engine tests."""

from __future__ import annotations

from typing import Any

from durable_sandbox.engine import RunState


class Crash(BaseException):
    """Raised by a step to stop the run as a dying process would: nothing after it is recorded.

    A BaseException, so neither the step's retry handling nor the engine's failure handling sees it;
    the run is left `running` with the step's `started` record and no completion, exactly as after a kill.
    """


def ops(state: RunState) -> dict[str, Any]:
    return {o.op_id: o for o in state.operations}
