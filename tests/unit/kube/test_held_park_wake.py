"""A run parked because another replica holds its Lease wakes on the status event of a hand-over, also when the
phase it shows is the one it was parked in (Pending -> Running, never published -> Pending)."""

from __future__ import annotations

from durable_sandbox.kube.workflow.scheduler import held_run_may_be_free


def test_a_handover_within_the_first_second_wakes_the_parked_replica() -> None:
    assert held_run_may_be_free("Pending", "Pending")


def test_the_holders_running_status_does_not_wake_it() -> None:
    assert not held_run_may_be_free("Running", "Running")


def test_a_phase_change_wakes_it() -> None:
    assert held_run_may_be_free("Running", "Pending")
    assert held_run_may_be_free("Running", "Succeeded")
