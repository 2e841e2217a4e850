"""What every room of the Workflow wing works with, built once by the ``Operator`` (``kube/workflow/controller.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.api.resources import CustomObjects
from durable_sandbox.kube.holders.holding import Holding
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.kube.workflow.engines import Engines
from durable_sandbox.kube.workflow.publishing import Publisher
from durable_sandbox.kube.workflow.runs import Runs
from durable_sandbox.kube.workflow.settings import OperatorSettings

__all__ = ["Wing"]


@dataclass(frozen=True)
class Wing:
    objects: CustomObjects  # the Workflows and Sandboxes in the API server
    runs: Runs  # what this replica keeps of the runs it serves
    settings: OperatorSettings
    publisher: Publisher  # status and Events
    engines: Engines  # an engine per namespace, the provider policy
    holding: Holding  # which Workflow holds which Sandbox resource
    metrics: OperatorMetrics  # the process's (kube/process/application.py owns them)
    away: ApiServerAway  # where an API server that does not answer is reported (said once)
