"""The name of a run's terminal Event (kube/reporting/events.py): the same for every replica, one per end of a run,
and a valid Event name for any Workflow name."""

from __future__ import annotations

import re

from durable_sandbox.kube.reporting.events import LifecycleEvent, terminal_event

SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DONE = LifecycleEvent("Succeeded", "run hello-1234abcd succeeded (4/4 calls)")


def test_every_replica_derives_the_same_name_whatever_its_message() -> None:
    a = terminal_event(DONE, workflow="hello", uid="u-1", epoch=0)
    b = terminal_event(LifecycleEvent("Succeeded", "run hello-1234abcd succeeded (0/0 calls)"),
                       workflow="hello", uid="u-1", epoch=0)
    assert a.name == b.name
    assert a.name is not None and a.name.startswith("hello.")
    assert (a.reason, a.message, a.type) == (DONE.reason, DONE.message, DONE.type)


def test_another_end_of_the_run_or_another_run_gets_another_name() -> None:
    base = terminal_event(DONE, workflow="hello", uid="u-1", epoch=0).name
    failed = LifecycleEvent("Failed", "boom", "Warning")
    others = {
        terminal_event(DONE, workflow="hello", uid="u-1", epoch=1).name,  # retried after a failure, then ended
        terminal_event(failed, workflow="hello", uid="u-1", epoch=0).name,
        terminal_event(DONE, workflow="hello", uid="u-2", epoch=0).name,  # a new Workflow of the same name
    }
    assert base not in others and len(others) == 3


def test_a_long_workflow_name_still_makes_a_valid_event_name() -> None:
    for workflow in ("a" * 253, "a" * 235 + ".b-" + "c" * 15, "x.y"):
        name = terminal_event(DONE, workflow=workflow, uid="u", epoch=0).name
        assert name is not None and len(name) <= 253 and SUBDOMAIN.match(name), name
