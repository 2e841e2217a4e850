"""The operator's journal key: the secret behind every seal on its journal values (``kube/journal/sealing.py``).

It is a Secret in the operator's own namespace (``<namespace>/<name>``, the chart's default
``<release namespace>/<release fullname>-journal-key``), with 32 random bytes under ``data.key``. The first
replica to start creates it; every other replica, and every later start, reads the same one (a create that
loses the race reads the winner's). Why not a chart-generated Secret: a GitOps tool that renders the chart
(``helm template``) would generate a new key on every sync, and every journal would then fail its seals.

Where it is by default: the operator's own namespace, ``$POD_NAMESPACE`` (the chart sets it), else its
ServiceAccount's namespace (the in-cluster namespace file, for a Pod made without the chart), else, run by hand,
the namespace of the kubeconfig's current context (else ``default``), as kubectl chooses.

Whoever can read this Secret can forge journal values, exactly as whoever can write the operator's
Deployment can run anything as the operator: the chart grants ``get`` on it to the operator alone, and the
operator refuses to start with a key others can read where it can tell (``kube/journal/journal_key_readers.py``).
Deleting it makes every run in flight fail its seals (``JournalDamaged``): the runs stop and say so.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from kubernetes.aio.client import models as m

from durable_sandbox.kube.api.client import ApiException, KubeClient, is_conflict, is_not_found, is_transient

__all__ = ["DEFAULT_SECRET_NAME", "JournalKeyError", "default_location", "fetch", "load_or_create", "own_namespace",
           "parse_location"]

DEFAULT_SECRET_NAME = "durable-sandbox-journal-key"
DATA_KEY = "key"
KEY_BYTES = 32
IN_CLUSTER_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class JournalKeyError(RuntimeError):
    """The key cannot be read or made: the operator cannot start (it would write unsealed journals)."""


def own_namespace(environ: Mapping[str, str] | None = None, namespace_file: Path | str = IN_CLUSTER_NAMESPACE) -> str | None:
    """The operator's own namespace: ``$POD_NAMESPACE``, else its ServiceAccount's (in a Pod); None outside."""
    env = os.environ if environ is None else environ
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return Path(namespace_file).read_text().strip() or None
    except OSError:
        return None


def default_location(outside: Callable[[], str], *, environ: Mapping[str, str] | None = None,
                     namespace_file: Path | str = IN_CLUSTER_NAMESPACE) -> tuple[str, str]:
    """(namespace, name): the operator's own namespace (``outside()``, the kubeconfig context's, when it runs
    outside a cluster), and the default name."""
    return own_namespace(environ, namespace_file) or outside(), DEFAULT_SECRET_NAME


def parse_location(text: str, outside: Callable[[], str]) -> tuple[str, str]:
    """``namespace/name`` or ``name`` (in the default namespace of :func:`default_location`)."""
    if "/" in text:
        namespace, _, name = text.partition("/")
        if not namespace or not name or "/" in name:
            raise JournalKeyError(f"--journal-key-secret {text!r}: expected NAMESPACE/NAME or NAME")
        return namespace, name
    return default_location(outside)[0], text


async def load_or_create(api: KubeClient, namespace: str, name: str) -> bytes:
    """The key in Secret ``namespace/name``, created (random) when there is none."""
    for _ in range(3):
        try:
            secret: Any = await api.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if not is_not_found(exc):
                raise JournalKeyError(_explain(exc, "read", namespace, name)) from None
        else:
            return _decode(secret, namespace, name)
        body = m.V1Secret(
            metadata=m.V1ObjectMeta(name=name, labels={"app.kubernetes.io/managed-by": "durable-sandbox"}),
            type="Opaque", data={DATA_KEY: base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()},
        )
        try:
            created: Any = await api.core.create_namespaced_secret(namespace, body)
        except ApiException as exc:
            if is_conflict(exc):
                continue  # another replica made it first: read theirs
            raise JournalKeyError(_explain(exc, "create", namespace, name)) from None
        return _decode(created, namespace, name)
    raise JournalKeyError(f"Secret {namespace}/{name} (the journal key) kept appearing and disappearing")


def _decode(secret: Any, namespace: str, name: str) -> bytes:
    raw = (secret.data or {}).get(DATA_KEY)
    try:
        key = base64.b64decode(raw or "", validate=True)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise JournalKeyError(
            f"Secret {namespace}/{name} has no usable journal key in data.{DATA_KEY} (at least 16 bytes, "
            f"base64); delete it to have a new one made (runs in flight then fail their seals and stop)."
        )
    return key


def _explain(exc: ApiException, verb: str, namespace: str, name: str) -> str:
    if exc.status == 403:
        return (f"The operator may not {verb} Secret {namespace}/{name}, which holds its journal key: grant its "
                f"ServiceAccount get and create on it (the chart does), or name another with --journal-key-secret.")
    return f"Cannot {verb} Secret {namespace}/{name} (the journal key): {exc.status} {exc.reason}"


async def fetch(namespace: str, name: str, *, kubeconfig: str | None = None, attempts: int = 8) -> bytes:
    """:func:`load_or_create` with a client of its own, retrying while the API server is starting or away
    (transient errors, with backoff: about a minute in all)."""
    import asyncio

    delay = 0.5
    for attempt in range(attempts):
        try:
            async with await KubeClient.connect(kubeconfig=kubeconfig) as api:
                return await load_or_create(api, namespace, name)
        except Exception as exc:
            if not is_transient(exc) or attempt == attempts - 1:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise AssertionError("unreachable")
