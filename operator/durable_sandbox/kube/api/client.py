"""The async Kubernetes API client every part of the package uses (store, leases, operator, ``dsb --kube``).

``kubernetes.aio`` is the official client's async package (``kubernetes`` >= 37): generated typed models,
``resourceVersion`` preconditions, and aiohttp underneath, the same stack kopf runs on, so no request ever
blocks the event loop and no thread pool is involved. Configuration comes from ``$KUBECONFIG`` (or
``~/.kube/config``) when there is one, else from the in-cluster service account.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kubernetes.aio import client as k8s

from durable_sandbox.kube.api.api_errors import (
    ApiException,
    brief,
    is_conflict,
    is_gone,
    is_not_found,
    is_precondition_failed,
    is_transient,
)
from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.providers.contract import ConfigurationError
from durable_sandbox.providers.kubernetes_api import json_body, load_configuration

__all__ = [
    "ApiException", "KubeClient", "brief", "is_conflict", "is_gone", "is_not_found", "is_precondition_failed", "is_transient",
    "json_body",
]  # fmt: skip

# At most this many connections to the API server per client (the kubernetes package's default is 100). Each
# idle TLS connection holds about 128 KiB of buffers, and a replica that parks many runs at once (a restart's
# listing) opened one per run: 40 Workflows cost 5 MiB that stayed for aiohttp's keep-alive. Requests beyond
# the bound wait for a connection; a replica's work is bound by the API server long before 16 are busy.
API_CONNECTIONS = 16


@dataclass
class KubeClient:
    """One aiohttp connection pool and the typed API groups on it. Close it with :meth:`close`.

    ``away`` is where everything that meets this API server not answering reports it (said once, by the operator
    that probes it: :class:`~durable_sandbox.kube.api.apiserver_away.ApiServerAway`; silent until given a probe).
    ``metrics``, when given (the operator's), counts its requests and the lease takeovers made through it."""

    api_client: k8s.ApiClient
    metrics: OperatorMetrics | None = None
    away: ApiServerAway = field(default_factory=ApiServerAway)

    def __post_init__(self) -> None:
        if self.metrics is not None:
            self.metrics.instrument_api_client(self.api_client)  # requests by verb, resource and status code
        self.core = k8s.CoreV1Api(self.api_client)
        self.coordination = k8s.CoordinationV1Api(self.api_client)
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.apis = k8s.ApisApi(self.api_client)  # discovery: the API groups the server serves

    @classmethod
    async def connect(cls, *, kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None,
                      metrics: OperatorMetrics | None = None, away: ApiServerAway | None = None) -> KubeClient:
        """Configuration from ``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else in-cluster."""
        # One way to read a kubeconfig for the whole package: the kubernetes provider's (providers are the bottom
        # layer, so the reader lives there).
        try:
            configuration = await load_configuration(kubeconfig=kubeconfig, context=context)
        except ConfigurationError as exc:
            raise RuntimeError(str(exc)) from exc.__cause__
        configuration.connection_pool_maxsize = API_CONNECTIONS
        return cls(k8s.ApiClient(configuration), metrics=metrics, away=away if away is not None else ApiServerAway())

    async def close(self) -> None:
        await self.api_client.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
