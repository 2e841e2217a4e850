"""WorkflowSchedule resources: Workflows made from a template on a schedule (kube/schedule/controller.py)."""

from durable_sandbox.kube.schedule.controller import ScheduleController, ScheduleSettings

__all__ = ["ScheduleController", "ScheduleSettings"]
