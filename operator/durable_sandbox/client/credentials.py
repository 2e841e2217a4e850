"""Where the client's Kubernetes token comes from: given, the in-cluster ServiceAccount, or the kubeconfig.

The token is read at each request (a mounted ServiceAccount token is rotated by the kubelet) and is only ever
sent in the Authorization header of the call API.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SERVICE_ACCOUNT_DIR", "CredentialsError", "default_namespace", "token_source"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(RuntimeError):
    pass


def _kubeconfig_path(kubeconfig: str | os.PathLike[str] | None) -> Path | None:
    if kubeconfig is not None:
        return Path(kubeconfig)
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0])
    default = Path.home() / ".kube" / "config"
    return default if default.exists() else None


def _context(config: dict[str, Any], context: str | None) -> dict[str, Any]:
    name = context or config.get("current-context")
    for entry in config.get("contexts") or []:
        if entry.get("name") == name:
            return dict(entry.get("context") or {})
    raise CredentialsError(f"the kubeconfig has no context {name!r}; pick one with context=... (kubectl config get-contexts)")


def _load(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CredentialsError(f"cannot read the kubeconfig {path}: {exc.strerror}") from None
    return loaded if isinstance(loaded, dict) else {}


def token_source(*, token: str | None = None, kubeconfig: str | os.PathLike[str] | None = None,
                 context: str | None = None) -> Callable[[], str]:
    """A function giving the current bearer token: ``token`` as given; else the kubeconfig user's token (or
    tokenFile); else the in-cluster ServiceAccount's."""
    if token:
        return lambda: token
    path = _kubeconfig_path(kubeconfig)
    if path is not None:
        config = _load(path)
        user_name = _context(config, context).get("user")
        user = next((dict(u.get("user") or {}) for u in config.get("users") or [] if u.get("name") == user_name), {})
        if user.get("token"):
            found = str(user["token"])
            return lambda: found
        if user.get("tokenFile"):
            file = Path(user["tokenFile"])
            return lambda: file.read_text().strip()
        raise CredentialsError(
            f"the kubeconfig user {user_name!r} ({path}) has no token (a client certificate or an exec plugin is not "
            f"sent to the call API); pass token=... (kubectl create token <serviceaccount> makes one)")
    sa_token = SERVICE_ACCOUNT_DIR / "token"
    if sa_token.exists():
        return lambda: sa_token.read_text().strip()
    raise CredentialsError("no Kubernetes credentials: no token given, no kubeconfig ($KUBECONFIG, ~/.kube/config) "
                           "and no in-cluster ServiceAccount token; pass token=...")


def default_namespace(*, kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> str:
    """The kubeconfig context's namespace, else the in-cluster ServiceAccount's, else ``default``."""
    path = _kubeconfig_path(kubeconfig)
    if path is not None:
        namespace = _context(_load(path), context).get("namespace")
        if namespace:
            return str(namespace)
    sa_namespace = SERVICE_ACCOUNT_DIR / "namespace"
    if sa_namespace.exists():
        return sa_namespace.read_text().strip()
    return "default"
