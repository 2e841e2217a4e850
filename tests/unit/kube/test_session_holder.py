"""The Sandbox's holder while a session call runs (kube/holders/holding.py SESSION_CLAIM): it holds the Sandbox against
Workflows and the idle timer without a run to ask about, until let go or for SESSION_HOLD_SECONDS after it was
taken, so an operator killed mid-call does not hold the Sandbox for ever."""

from __future__ import annotations

import time
from typing import Any

from durable_sandbox.kube.holders.holding import SESSION_CLAIM, SESSION_HOLD_SECONDS, Holding
from durable_sandbox.kube.journal.sandbox_records import ACTIVE_AT, HOLDER


async def no_run_is_live(_namespace: str, _workflow: str) -> bool:
    return False  # a session holder is never judged by a Workflow's run


def holding() -> Holding:
    objects: Any = None
    records: Any = None
    return Holding(objects, records, no_run_is_live)


async def test_a_session_call_holds_the_sandbox_while_it_runs() -> None:
    record = {HOLDER: SESSION_CLAIM, ACTIVE_AT: time.time() - 5}
    assert await holding().running_holder("demo", record) == SESSION_CLAIM


async def test_a_session_hold_left_by_a_killed_operator_runs_out() -> None:
    record = {HOLDER: SESSION_CLAIM, ACTIVE_AT: time.time() - SESSION_HOLD_SECONDS - 1}
    assert await holding().running_holder("demo", record) is None


async def test_a_workflow_holder_is_still_judged_by_its_run() -> None:
    assert await holding().running_holder("demo", {HOLDER: "build", ACTIVE_AT: time.time()}) is None
