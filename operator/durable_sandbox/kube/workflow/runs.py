"""What this replica keeps of the Workflows it serves: one :class:`RunView` per active run, and the table
(:class:`Runs`) every room of the Workflow wing shares."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine.records import RunRecord
from durable_sandbox.kube.api.objects import ObjectView
from durable_sandbox.kube.reporting.status import Extra, Projection, StatusWriter

if TYPE_CHECKING:
    from durable_sandbox.sandbox_engine import Engine

__all__ = ["Parked", "RunView", "Runs"]


@dataclass(kw_only=True)
class RunView(ObjectView):
    """What this process knows of one Workflow's run: the projection it writes as status."""

    run_id: str
    projection: Projection = field(default_factory=Projection)
    extra: Extra = field(default_factory=Extra)
    run: RunRecord | None = None
    writer: StatusWriter | None = None
    phase: str | None = None
    signals_sent: dict[str, Any] = field(default_factory=dict)
    cancel_sent: bool = False
    executing: bool = False  # this process holds the lease and writes status/events
    waiting_for: str | None = None  # the Sandbox (spec.sandboxRef) the run waits for
    released: bool = False  # the Sandbox this run held has been let go
    leftovers_removed: bool = False  # the providers were asked for what the finished run left (leftovers.py)
    chain: list[RunRecord] = field(default_factory=list)  # the runs before run_id that continued as new (chain.py)


@dataclass(slots=True)
class Parked:
    """All this process keeps of a parked run: enough to find it again and to judge which events wake it."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    # waiting, suspended, finished, held (another replica's Lease), not-runnable, rejected, backoff, error,
    # api-unreachable
    reason: str
    phase: str | None  # status.phase when parked: a held run wakes when the executing replica changes it
    sandbox: str | None = None  # the Sandbox (spec.sandboxRef) the run waits for
    timer: asyncio.TimerHandle | None = None


@dataclass
class Runs:
    """The runs of this replica, by run id: active ones (a task drives them, ``views`` has what the task
    knows), parked ones (no task), and what admission handed over for the engine's extensions (Secret
    values, literal env values: never stored). ``stopping`` once the replica stops (SIGTERM)."""

    views: dict[str, RunView] = field(default_factory=dict)
    active: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    parked: dict[str, Parked] = field(default_factory=dict)
    engines: dict[str, Engine] = field(default_factory=dict)  # namespace -> its engine
    secrets: dict[str, dict[tuple[str, str], str]] = field(default_factory=dict)
    env_values: dict[str, dict[str, str]] = field(default_factory=dict)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # set when the replica stops
    stopping: bool = False

    def forget(self, run_id: str) -> None:
        """The run's task ended: drop what only the task needed (under every id of its chain, kube/workflow/chain.py)."""
        view = self.views.pop(run_id, None)
        for key in (run_id, *([view.run_id] if view is not None else [])):
            if self.views.get(key) is view:
                self.views.pop(key, None)
            self.secrets.pop(key, None)
            self.env_values.pop(key, None)
