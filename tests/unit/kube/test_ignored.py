"""kube/workflow/ignored.py: which steering fields a finished run ignores, and how that is said."""

from __future__ import annotations

from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.workflow.ignored import ignored_fields, ignored_notice


def test_fields_that_ask_a_finished_run_for_something() -> None:
    done = RunRecord("r", "w", status=RunStatus.SUCCEEDED)
    spec = {"cancel": True, "suspend": True, "signals": {"approve": True, "late": 1}}
    assert ignored_fields(spec, done, answered={"approve"}) == ["spec.cancel", "spec.suspend", "spec.signals.late"]
    cancelled = RunRecord("r", "w", status=RunStatus.CANCELLED)
    assert ignored_fields({"cancel": True, "suspend": False}, cancelled, answered=()) == []


def test_the_notice_names_the_field_and_what_to_do_instead() -> None:
    reason, message = ignored_notice(["spec.signals.late"], "Succeeded", 4)
    assert reason == "SignalIgnored"
    assert message.startswith("spec.signals.late changed (generation 4) after the run succeeded: ")
    assert "kubectl replace --force -f <file>" in message and "spec.retry" in message
    assert ignored_notice(["spec.suspend"], "Failed", 2)[0] == "SuspendIgnored"
    assert ignored_notice([], "Cancelled", 2) == ("ChangeIgnored", ignored_notice([], "Cancelled", 2)[1])
    assert "the spec changed (generation 2) after the run was cancelled" in ignored_notice([], "Cancelled", 2)[1]
