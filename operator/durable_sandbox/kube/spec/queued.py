"""The program of a Workflow that names a worker queue (``spec.worker``), as the operator holds it: the entrypoint
by name only. The operator never imports a worker's code (it need not be importable in the operator's image, and
the operator must not run it with its own rights); it records the run under the entrypoint's name and leaves its
execution to the namespace's workers (``dsb worker --kube``, ``kube/workers/``), which import it themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine import WorkflowDefinition

__all__ = ["QueuedWorkflow", "queued_workflow"]


@dataclass(frozen=True)
class QueuedWorkflow(WorkflowDefinition):
    """A workflow named by ``module:function`` and executed elsewhere: its ``ref`` is its name (the import path a
    worker resolves), and calling it here is an error that says where it runs."""

    queue: str = ""

    @property
    def ref(self) -> str | None:
        return self.name


def queued_workflow(entrypoint: str, queue: str) -> QueuedWorkflow:
    async def not_here(*_: Any) -> Any:
        raise RuntimeError(f"{entrypoint} is executed by the workers of queue {queue!r} (dsb worker --kube --queue "
                           f"{queue}) in the Workflow's namespace, never by the operator")

    return QueuedWorkflow(name=entrypoint, version="", fn=not_here, input=None, queue=queue)
