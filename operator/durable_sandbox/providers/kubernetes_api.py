"""The ``kubernetes`` provider's connection to the API server: ``kubernetes.aio`` configured from a kubeconfig
(``$KUBECONFIG``, else ``~/.kube/config``) or, inside the cluster, from the Pod's service account.

Providers import nothing of the package above them, so this is the provider's own (``kube/api/client.py`` uses it
too: one way to read a kubeconfig). Pods, Secrets and ``pods/exec`` are reached with it, with the operator's
identity; the sandbox itself never gets a token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client.exceptions import ApiException

from durable_sandbox.providers.contract import ConfigurationError

__all__ = ["any_file", "default_namespace", "json_body", "load_configuration"]

_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def any_file(paths: str) -> bool:
    """Whether any of the ``os.pathsep``-separated paths (as in ``$KUBECONFIG``) is a file."""
    return any(os.path.isfile(p) for p in paths.split(os.pathsep) if p)


def _chosen_kubeconfig(kubeconfig: str | os.PathLike[str] | None) -> str | None:
    """The kubeconfig to read, or None for the in-cluster service account."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    default = Path.home() / ".kube" / "config"
    if path is None and not default.exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    return str(path) if path is not None else str(default)


async def load_configuration(*, kubeconfig: str | os.PathLike[str] | None = None,
                             context: str | None = None) -> k8s.Configuration:
    """A client configuration from ``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else in-cluster.
    Raises :class:`ConfigurationError` saying what to set when none is usable."""
    configuration = k8s.Configuration()
    chosen = _chosen_kubeconfig(kubeconfig)
    if chosen is None:
        k8s_config.load_incluster_config(client_configuration=configuration)
        return configuration
    # $KUBECONFIG may list several files; the client merges those that exist and, when none does, only
    # logs a bare "Config not found" line before failing with a misleading message. Say what is wrong.
    if not any_file(chosen):
        raise ConfigurationError(
            f"Cannot configure the Kubernetes client from {chosen}: no such kubeconfig file. Set KUBECONFIG "
            f"to a kubeconfig for the cluster, or run inside the cluster with a service account.")
    try:
        await k8s_config.load_kube_config(config_file=chosen, context=context, client_configuration=configuration,
                                          persist_config=False)
    except (k8s_config.ConfigException, FileNotFoundError) as exc:
        raise ConfigurationError(
            f"Cannot configure the Kubernetes client from {chosen}: {exc}. Set KUBECONFIG to a kubeconfig for "
            f"the cluster, or run inside the cluster with a service account.") from exc
    return configuration


def default_namespace(*, kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> str:
    """The namespace a client uses when none is named: the kubeconfig context's, the Pod's own, else default."""
    chosen = _chosen_kubeconfig(kubeconfig)
    if chosen is None:
        try:
            return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"
    try:
        import yaml

        for path in chosen.split(os.pathsep):
            if not os.path.isfile(path):
                continue
            data: Any = yaml.safe_load(Path(path).read_text()) or {}
            name = context or data.get("current-context")
            for entry in data.get("contexts") or []:
                if entry.get("name") == name:
                    return str((entry.get("context") or {}).get("namespace") or "default")
    except (OSError, ValueError, AttributeError):
        pass
    return "default"


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
