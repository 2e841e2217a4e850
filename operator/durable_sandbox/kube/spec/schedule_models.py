"""The ``WorkflowSchedule`` resource (``durable-sandbox.dev/v1alpha1``, short name ``dwfsched``): Workflows made
from a template on a cron schedule in a time zone, or every N. What a turn does is :mod:`durable_sandbox.schedules`
(pure); the controller that carries it out is :mod:`durable_sandbox.kube.schedule`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, model_validator

from durable_sandbox.kube.spec.models import Condition, ObjectMeta, WorkflowSpec, _Model, _Status
from durable_sandbox.schedules import Concurrency, Policy, Timing

__all__ = ["ScheduledWorkflowRef", "WorkflowScheduleResource", "WorkflowScheduleSpec", "WorkflowScheduleStatus",
           "WorkflowTemplate", "WorkflowTemplateMeta"]

SCHEDULE_CONDITIONS = ("Ready", "Suspended")
RECENT_MISSED = 10  # status.recentMissedTicks keeps this many


class WorkflowTemplateMeta(_Model):
    """Labels and annotations every Workflow made from the template gets (the operator adds its own label)."""

    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the Workflows made.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the Workflows made.")


class WorkflowTemplate(_Model):
    """The Workflow each tick makes: named <schedule>-<Unix time of the tick, seconds>, owned by the schedule."""

    metadata: WorkflowTemplateMeta | None = Field(default=None, description="Labels and annotations.")
    spec: WorkflowSpec = Field(description="The Workflow's spec, as in a Workflow.")


class WorkflowScheduleSpec(_Model):
    """When to make a Workflow from workflowTemplate, and what to do with the ones still running."""

    schedule: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description="A 5-field cron expression (minute hour day-of-month month day-of-week, e.g. "
        "'*/5 * * * *', or @hourly, @daily...), read in timeZone. Set exactly one of schedule or every.")
    time_zone: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="The IANA time zone schedule is read in (e.g. Europe/Berlin). Default: UTC. A wall "
        "time the zone skips fires when the clock jumps; one it repeats fires once.")
    every: Annotated[str, Field(pattern=r"^\s*(\d+|(\d+d)?\s*(\d+h)?\s*(\d+m)?\s*(\d+s)?)\s*$", min_length=1,
                                max_length=32)] | None = (
        Field(default=None, description="A period (30s, 5m, 1h30m, 2d): ticks at multiples of it since the Unix "
              "epoch. Set exactly one of schedule or every."))
    concurrency_policy: Literal["Allow", "Forbid", "Replace"] = Field(
        default="Allow", description="When a tick is due while Workflows it made still run: Allow (run beside "
        "them), Forbid (the tick waits for them, within startingDeadlineSeconds), Replace (delete them, then run).")
    starting_deadline_seconds: Annotated[int, Field(ge=0, le=31_536_000, strict=True)] | None = Field(
        default=None, description="A tick that cannot start within this many seconds of its time (the operator "
        "was down, Forbid waited) is not run: it is recorded in status.missedTicks with a Warning Event.")
    successful_runs_history_limit: Annotated[int, Field(ge=0, le=1000, strict=True)] = Field(
        default=3, description="Succeeded Workflows kept; older ones are deleted.")
    failed_runs_history_limit: Annotated[int, Field(ge=0, le=1000, strict=True)] = Field(
        default=1, description="Failed or cancelled Workflows kept; older ones are deleted.")
    suspend: StrictBool = Field(
        default=False, description="True: ticks are passed over (not run, not run later when set back to false).")
    workflow_template: WorkflowTemplate = Field(description="The Workflow each tick makes.")

    @model_validator(mode="after")
    def _one_timing(self) -> WorkflowScheduleSpec:
        self.timing()
        return self

    def timing(self) -> Timing:
        return Timing.of(schedule=self.schedule, time_zone=self.time_zone, every=self.every)

    def policy(self) -> Policy:
        return Policy(concurrency=Concurrency(self.concurrency_policy),
                      starting_deadline_seconds=self.starting_deadline_seconds,
                      successful_history=self.successful_runs_history_limit,
                      failed_history=self.failed_runs_history_limit, suspend=self.suspend)


class ScheduledWorkflowRef(_Status):
    name: str = Field(description="The Workflow's name.")
    uid: str = Field(description="Its uid (what the schedule owns: a namesake is not its).")


class WorkflowScheduleStatus(_Status):
    """Where the schedule is, written by the operator."""

    conditions: list[Condition] = Field(default_factory=list, description="Ready (the spec is valid and the "
                                        "schedule runs), Suspended.")
    observed_generation: int | None = Field(default=None, description="The spec generation last acted on.")
    last_schedule_time: str | None = Field(default=None, description="The last tick made, missed or passed over.")
    last_scheduled_workflow: str | None = Field(default=None, description="The Workflow the last tick made.")
    next_schedule_time: str | None = Field(default=None, description="The next tick.")
    active: list[ScheduledWorkflowRef] = Field(default_factory=list, description="Its Workflows still running.")
    missed_ticks: int = Field(default=0, description="Ticks not run since the schedule was made: too late for "
                              "startingDeadlineSeconds, or superseded by a newer tick while no operator ran.")
    recent_missed_ticks: list[str] = Field(default_factory=list, description="The newest missed ticks' times.")
    kopf: dict[str, object] | None = Field(default=None, description="The operator's own bookkeeping. Not for users.")


class WorkflowScheduleResource(_Model):
    """Workflows made from a template on a schedule."""

    api_version: Literal["durable-sandbox.dev/v1alpha1"] = "durable-sandbox.dev/v1alpha1"
    kind: Literal["WorkflowSchedule"] = "WorkflowSchedule"
    metadata: ObjectMeta
    spec: WorkflowScheduleSpec
    status: WorkflowScheduleStatus | None = None
