"""What `dsb operator` was started with, built once before the operator runs and never changed afterwards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from durable_sandbox.kube.store.journals import ApiServerJournal, JournalChoice
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.kube.workflow.settings import OperatorPolicy, OperatorSettings
from durable_sandbox.providers.contract import SandboxProvider

if TYPE_CHECKING:
    from durable_sandbox.kube.workflow.controller import Operator

__all__ = ["OperatorConfig", "PoolProviderFactory", "ProviderFactory", "Service"]

# Makes the provider of a name, counted in the operator's metrics (the CLI's: the registry's, instrumented).
ProviderFactory = Callable[[str, OperatorMetrics], SandboxProvider]
# Makes the kubernetes provider for SandboxPools' Pods (with the pool key), its claims counted in the metrics.
PoolProviderFactory = Callable[[OperatorMetrics], Any]


class Service(Protocol):
    """Something the process serves beside its controllers, from its parts (the Sandboxes' call API,
    ``sessions/``): started once the controllers are built, stopped first at close (it may use them)."""

    async def start(self, workflows: Operator) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class OperatorConfig:
    """The operator process's configuration: frozen, so nothing after the start can change what it serves."""

    policy: OperatorPolicy = field(default_factory=OperatorPolicy)
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    kubeconfig: str | None = None
    namespaces: tuple[str, ...] = ()  # served namespaces; empty: every namespace
    journal_key: bytes | None = field(default=None, repr=False)  # kube/journal/journal_key.py; never printed
    journal: JournalChoice = field(default_factory=ApiServerJournal)  # where runs' journals go (kube/store/journals.py)
    providers: ProviderFactory | None = None  # None: the registry's providers, uncounted (tests)
    pool_provider: PoolProviderFactory | None = None  # None: pools say the provider is off here
    metrics_port: int | None = None  # /metrics, /healthz, /readyz (kube/telemetry/metrics_server.py); None: not served
    metrics_host: str = "0.0.0.0"
    egress_policy: str = ""  # the chart's NetworkPolicy of sandbox Pods (DSB_K8S_EGRESS_POLICY); said at start
    services: tuple[Service, ...] = ()  # served beside the controllers (the call API); started and stopped here
