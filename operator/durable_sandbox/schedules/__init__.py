"""Schedules: when a WorkflowSchedule (or a ``dsb schedule``) fires, and what one turn of it does. Pure: no clock,
no store, no API server (kube/schedule/ and runs/schedules.py carry the plans out)."""

from durable_sandbox.schedules.cron import CronError, CronExpression
from durable_sandbox.schedules.plan import Child, ChildState, Concurrency, Policy, TurnPlan, plan_turn
from durable_sandbox.schedules.timing import NAME_MAX, Timing, parse_every, tick_name

__all__ = ["NAME_MAX", "Child", "ChildState", "Concurrency", "CronError", "CronExpression", "Policy", "Timing",
           "TurnPlan", "parse_every", "plan_turn", "tick_name"]
