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


def test_a_suspended_runs_status_overwritten_by_a_late_write_wakes_it_to_write_it_again() -> None:
    # The replica that handed the run over flushed its coalesced "Pending" after the suspending replica's
    # "Suspended" (the soak's soak-023-suspend stayed Pending for ever, its driver waiting to resume it).
    from durable_sandbox.kube.workflow.scheduler import parked_run_wakes

    assert parked_run_wakes("suspended", "Running", "Pending")
    assert parked_run_wakes("suspended", "Suspended", None)
    assert not parked_run_wakes("suspended", "Pending", "Suspended")  # its own write: stays parked


def test_a_finished_runs_status_shown_unfinished_wakes_it_and_its_own_terminal_status_does_not() -> None:
    from durable_sandbox.kube.workflow.scheduler import parked_run_wakes

    assert parked_run_wakes("finished", "Running", "Running")
    assert not parked_run_wakes("finished", "Running", "Succeeded")


def test_other_parks_ignore_status_events() -> None:
    from durable_sandbox.kube.workflow.scheduler import parked_run_wakes

    assert not parked_run_wakes("waiting", "Waiting", "Pending")
    assert parked_run_wakes("held", "Pending", "Pending")
