"""The per-replica cap on executing runs (kube/workflow/concurrency.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from durable_sandbox.kube.workflow.concurrency import (
    CONCURRENCY_LIMIT_REASON,
    RunSlots,
    concurrency_limit_condition,
)


async def test_at_most_limit_runs_hold_a_slot_and_the_rest_start_in_arrival_order() -> None:
    slots = RunSlots(2)
    release = {f"r{i}": asyncio.Event() for i in range(5)}
    started: list[str] = []
    told_to_wait: list[str] = []
    most = 0

    async def run(run_id: str) -> None:
        nonlocal most
        async with slots.slot(run_id, on_wait=lambda: told_to_wait.append(run_id)):
            started.append(run_id)
            most = max(most, len(slots.executing))
            await release[run_id].wait()

    tasks = [asyncio.create_task(run(r)) for r in release]
    await _until(lambda: len(slots.waiting) == 3)
    assert started == ["r0", "r1"] and told_to_wait == ["r2", "r3", "r4"] and slots.waiting == ("r2", "r3", "r4")
    release["r1"].set()
    await _until(lambda: "r2" in started)
    assert slots.executing == {"r0", "r2"} and slots.waiting == ("r3", "r4")
    for event in release.values():
        event.set()
    await asyncio.gather(*tasks)
    assert started == ["r0", "r1", "r2", "r3", "r4"] and most == 2
    assert slots.executing == frozenset() and slots.waiting == ()


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    slots = RunSlots(1)
    hold = asyncio.Event()

    async def holder() -> None:
        async with slots.slot("a"):
            await hold.wait()

    async def waiter() -> None:
        async with slots.slot("b"):
            raise AssertionError("b never gets the slot: it is cancelled while waiting")

    first = asyncio.create_task(holder())
    await _until(lambda: slots.executing == {"a"})
    second = asyncio.create_task(waiter())
    await _until(lambda: slots.waiting == ("b",))
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert slots.waiting == ()
    hold.set()
    await first
    async with slots.slot("c"):  # the slot came back
        assert slots.executing == {"c"}


async def test_on_wait_may_be_async_and_is_awaited_before_waiting() -> None:
    slots = RunSlots(1)
    shown: list[str] = []

    async def show_pending() -> None:
        shown.append("pending")

    async with slots.slot("a"):
        task = asyncio.create_task(_enter(slots, "b", show_pending))
        await _until(lambda: slots.waiting == ("b",) and shown == ["pending"])
    await task
    assert shown == ["pending"]


async def test_a_run_cannot_hold_two_slots() -> None:
    slots = RunSlots(3)
    async with slots.slot("a"):
        with pytest.raises(RuntimeError, match="run a already holds an execution slot"):
            async with slots.slot("a"):
                pass


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_limit_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="--max-concurrent-runs must be a positive integer"):
        RunSlots(bad)  # type: ignore[arg-type]


def test_the_condition_names_the_reason_and_the_setting() -> None:
    condition = concurrency_limit_condition(5, 45)
    assert condition["type"] == "Ready" and condition["status"] == "False"
    assert condition["reason"] == CONCURRENCY_LIMIT_REASON == "ConcurrencyLimit"
    assert "--max-concurrent-runs 5" in condition["message"] and "45 run(s) queued" in condition["message"]


async def _enter(slots: RunSlots, run_id: str, on_wait: Callable[[], Awaitable[None]]) -> None:
    async with slots.slot(run_id, on_wait=on_wait):
        pass


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the other tasks run until ``condition()`` holds (a deadline, not a sleep standing in for it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached within the deadline")
        await asyncio.sleep(0)
