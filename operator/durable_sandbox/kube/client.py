"""The async Kubernetes API client every part of the package uses (store, leases, operator, ``dsb --kube``).

``kubernetes.aio`` is the official client's async package (``kubernetes`` >= 37): generated typed models,
``resourceVersion`` preconditions, and aiohttp underneath, the same stack kopf runs on, so no request ever
blocks the event loop and no thread pool is involved. Configuration comes from ``$KUBECONFIG`` (or
``~/.kube/config``) when there is one, else from the in-cluster service account.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client.exceptions import ApiException

from durable_sandbox.kube.metrics import METRICS

__all__ = [
    "ApiException", "KubeClient", "is_conflict", "is_gone", "is_not_found", "is_precondition_failed", "is_transient",
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


def is_precondition_failed(exc: BaseException) -> bool:
    """A JSON Patch ``test`` op did not hold (the apiserver answers 422 Unprocessable Entity)."""
    return isinstance(exc, ApiException) and exc.status == 422


async def json_body(call: Awaitable[Any], *, parse: bool = True) -> dict[str, Any]:
    """The JSON body of a ``*_without_preload_content`` call ({} unless ``parse``), or ApiException for an
    error status.

    For large objects (no typed models are built) and for answers the generated client does not map
    (a server-side apply that creates its object answers 201, which its patch call decodes as None)."""
    resp = await call
    try:
        body = await resp.read()
    finally:
        resp.release()
    if resp.status >= 400:
        raise ApiException(status=resp.status, reason=resp.reason, body=body.decode(errors="replace"))
    out: dict[str, Any] = json.loads(body) if body and parse else {}
    return out


def _any_file(paths: str) -> bool:
    """Whether any of the ``os.pathsep``-separated paths (as in ``$KUBECONFIG``) is a file."""
    return any(os.path.isfile(p) for p in paths.split(os.pathsep) if p)


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
        configuration = k8s.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG") or None
        default = Path.home() / ".kube" / "config"
        if path is None and not default.exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            # Read here, not at import: the kubernetes package snapshots $KUBECONFIG when it is imported.
            chosen = str(path) if path is not None else str(default)
            # $KUBECONFIG may list several files; the client merges those that exist and, when none does, only
            # logs a bare "Config not found" line before failing with a misleading message. Say what is wrong.
            if not _any_file(chosen):
                raise RuntimeError(
                    f"Cannot configure the Kubernetes client from {chosen}: no such kubeconfig file. Set KUBECONFIG "
                    f"to a kubeconfig for the cluster, or run inside the cluster with a service account."
                )
            try:
                await k8s_config.load_kube_config(
                    config_file=chosen, context=context, client_configuration=configuration, persist_config=False
                )
            except (k8s_config.ConfigException, FileNotFoundError) as exc:
                raise RuntimeError(
                    f"Cannot configure the Kubernetes client from {chosen}: {exc}. Set KUBECONFIG to a "
                    f"kubeconfig for the cluster, or run inside the cluster with a service account."
                ) from exc
        return cls(k8s.ApiClient(configuration))

    async def close(self) -> None:
        await self.api_client.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
