"""Issue 27 item 3, idle Sandboxes: when the idle timer suspends (the pure plan), and the one-holder rule between a
Workflow taking a Sandbox and the idle timer's claim (``Holding`` over the real ``SandboxRecords``, with the
Journal object kept in memory and JSON Patch ``test`` ops honoured as the API server honours them)."""

from __future__ import annotations

import asyncio

import pytest

from durable_sandbox.kube.journal.sandbox_records import ACTIVE_AT, HOLDER, IDLE_CLAIM, IDLE_SUSPENDED
from durable_sandbox.kube.sandbox.idle import ACTIVE, IDLE, SUSPENDED, plan_idle
from tests.unit.kube.sandbox_records_support import LIVE, NAME, NS, UID, World

# ------------------------------------------------------------------ the plan


def test_an_unheld_live_sandbox_is_idle_and_suspends_once_the_time_has_passed() -> None:
    plan = plan_idle(after=60, live=True, held=False, last_active=1000.0, suspended_at=None, now=1030.0)
    assert (plan.state, plan.since, plan.suspend, plan.due_in) == (IDLE, 1000.0, False, 30.0)
    plan = plan_idle(after=60, live=True, held=False, last_active=1000.0, suspended_at=None, now=1060.0)
    assert plan.suspend and plan.due_in == 0.0


def test_a_held_sandbox_never_suspends_for_idleness() -> None:
    plan = plan_idle(after=60, live=True, held=True, last_active=0.0, suspended_at=None, now=10_000.0)
    assert (plan.state, plan.suspend, plan.due_in) == (ACTIVE, False, None)


def test_without_idle_suspend_after_there_is_no_timer() -> None:
    plan = plan_idle(after=None, live=True, held=False, last_active=0.0, suspended_at=None, now=10_000.0)
    assert (plan.state, plan.suspend, plan.due_in) == (IDLE, False, None)


def test_a_sandbox_without_a_live_sandbox_is_suspended_since_it_was_suspended() -> None:
    plan = plan_idle(after=60, live=False, held=False, last_active=0.0, suspended_at=500.0, now=10_000.0)
    assert (plan.state, plan.since, plan.suspend) == (SUSPENDED, 500.0, False)


def test_no_last_activity_known_means_no_timer_yet() -> None:
    plan = plan_idle(after=60, live=True, held=False, last_active=None, suspended_at=None, now=10_000.0)
    assert not plan.suspend and plan.due_in is None


# ------------------------------------------------------------------ the one-holder rule




def test_a_workflow_that_takes_the_sandbox_first_makes_the_idle_claim_fail() -> None:
    world = World(LIVE)
    seen = world.record()  # the idle timer read it: due
    assert world.hold("wf") is None  # meanwhile a Workflow took it
    assert not world.claim(seen)
    assert world.record()[HOLDER] == "wf"


def test_a_workflow_that_took_and_let_go_meanwhile_makes_the_idle_claim_fail_too() -> None:
    world = World(LIVE)
    seen = world.record()
    assert world.hold("wf") is None
    asyncio.run(world.holding.release(NS, NAME, "wf"))
    assert world.record().get(HOLDER) is None and world.record()[ACTIVE_AT] > seen[ACTIVE_AT]
    assert not world.claim(seen)  # the holder is free again, but the Sandbox was just used


def test_while_the_idle_timer_holds_it_a_workflow_waits_and_takes_nothing() -> None:
    world = World(LIVE)
    assert world.claim(world.record())
    waits = world.hold("wf")
    assert waits is not None and "being suspended" in waits
    assert world.record()[HOLDER] == IDLE_CLAIM and world.objects.shown == []


def test_a_workflow_takes_an_idle_suspended_sandbox_and_waits_for_it_to_resume() -> None:
    world = World({"phase": "Suspended", IDLE_SUSPENDED: True, ACTIVE_AT: 1000.0})
    waits = world.hold("wf")
    assert waits is not None and "resuming" in waits
    assert world.record()[HOLDER] == "wf" and world.objects.shown == ["wf"]  # the controller is woken by it
    waits = world.hold("wf")  # looked again before the controller resumed it: still waiting
    assert waits is not None and "resuming" in waits
    asyncio.run(world.records.write(NS, NAME, UID, {"phase": "Ready", "providerId": "lsb-2", IDLE_SUSPENDED: None}))
    assert world.hold("wf") is None


def test_a_sandbox_suspended_on_request_is_not_resumed_by_a_workflow() -> None:
    world = World({"phase": "Suspended", IDLE_SUSPENDED: True, ACTIVE_AT: 1000.0},
                  spec={"provider": "local", "idleSuspendAfterSeconds": 5, "suspend": True})
    waits = world.hold("wf")
    assert waits is not None and "not Ready" in waits and world.record().get(HOLDER) is None


def test_the_idle_claim_is_no_running_workflow() -> None:
    world = World(LIVE)
    assert world.claim(world.record())
    assert asyncio.run(world.holding.running_holder(NS, world.record())) is None


@pytest.mark.parametrize("field", ["phase", "providerId"])
def test_a_sandbox_that_is_not_ready_is_not_taken_unless_idle_suspended(field: str) -> None:
    world = World({**LIVE, field: "Provisioning" if field == "phase" else None})
    assert world.hold("wf") is not None and world.record().get(HOLDER) is None
