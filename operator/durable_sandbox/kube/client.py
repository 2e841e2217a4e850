"""The async Kubernetes API client every part of the package uses (store, leases, operator, ``dsb --kube``).

``kubernetes.aio`` is the official client's async package (``kubernetes`` >= 37): generated typed models,
``resourceVersion`` preconditions, and aiohttp underneath, the same stack kopf runs on, so no request ever
blocks the event loop and no thread pool is involved. Configuration comes from ``$KUBECONFIG`` (or
``~/.kube/config``) when there is one, else from the in-cluster service account.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException

from durable_sandbox.kube.metrics import METRICS
from durable_sandbox.providers.contract import ConfigurationError
from durable_sandbox.providers.kubernetes_api import json_body, load_configuration

__all__ = [
    "ApiException", "KubeClient", "brief", "is_conflict", "is_gone", "is_not_found", "is_precondition_failed", "is_transient",
    "json_body",
]  # fmt: skip

def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def is_gone(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status in (404, 410)


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the connection failed or timed out, or the server is overloaded or failing."""
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504)
    return isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError)


def brief(exc: BaseException) -> str:
    """One line saying what went wrong with a request: ``HTTP 429 Too Many Requests: storage is (re)initializing``
    (the Status message of an ApiException, whose own text is a multi-line dump of headers and body), else the
    exception's type and text."""
    if isinstance(exc, ApiException):
        message = exc.body if isinstance(exc.body, str) else ""
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(message).get("message") or message  # a Status: its message says it all
        message = " ".join(message.split())
        return f"HTTP {exc.status} {exc.reason or ''}".rstrip() + (f": {message[:300]}" if message else "")
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def is_precondition_failed(exc: BaseException) -> bool:
    """A JSON Patch ``test`` op did not hold (the apiserver answers 422 Unprocessable Entity)."""
    return isinstance(exc, ApiException) and exc.status == 422


# At most this many connections to the API server per client (the kubernetes package's default is 100). Each
# idle TLS connection holds about 128 KiB of buffers, and a replica that parks many runs at once (a restart's
# listing) opened one per run: 40 Workflows cost 5 MiB that stayed for aiohttp's keep-alive. Requests beyond
# the bound wait for a connection; a replica's work is bound by the API server long before 16 are busy.
API_CONNECTIONS = 16


@dataclass
class KubeClient:
    """One aiohttp connection pool and the typed API groups on it. Close it with :meth:`close`."""

    api_client: k8s.ApiClient

    def __post_init__(self) -> None:
        METRICS.instrument_api_client(self.api_client)  # requests by verb, resource and status code
        self.core = k8s.CoreV1Api(self.api_client)
        self.coordination = k8s.CoordinationV1Api(self.api_client)
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.apis = k8s.ApisApi(self.api_client)  # discovery: the API groups the server serves

    @classmethod
    async def connect(cls, *, kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> KubeClient:
        """Configuration from ``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else in-cluster."""
        # One way to read a kubeconfig for the whole package: the kubernetes provider's (providers are the bottom
        # layer, so the reader lives there).
        try:
            configuration = await load_configuration(kubeconfig=kubeconfig, context=context)
        except ConfigurationError as exc:
            raise RuntimeError(str(exc)) from exc.__cause__
        configuration.connection_pool_maxsize = API_CONNECTIONS
        return cls(k8s.ApiClient(configuration))

    async def close(self) -> None:
        await self.api_client.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
