"""A namespace's worker key: the key that seals its journal values (``kube/journal/sealing.py``,
:func:`~durable_sandbox.kube.journal.sealing.namespace_key`), handed to that namespace's workers.

The operator writes it to Secret ``durable-sandbox-worker-key`` (``data.key``) in every namespace that has a
Workflow with ``spec.worker``, and puts it back when it finds it changed or gone. A worker (``dsb worker --kube``)
reads it with its own ServiceAccount, in its own namespace: it never holds the journal key, and what it seals
opens in its namespace only (the operator checks each namespace's values with that namespace's key). Whoever
may read Secrets in a namespace can seal that namespace's journal values, as its workers do: grant it to them
alone (the worker's Role, docs/kubernetes.md).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.aio.client import models as m

from durable_sandbox.kube.api.client import ApiException, KubeClient, is_conflict, is_not_found
from durable_sandbox.kube.journal.sealing import namespace_key

__all__ = ["WORKER_KEY_SECRET", "WorkerKeyError", "WorkerKeyMissing", "ensure_worker_key", "read_worker_key",
           "worker_key_handed"]

WORKER_KEY_SECRET = "durable-sandbox-worker-key"
_DATA_KEY = "key"
_MANAGED: Final[Mapping[str, str]] = {"app.kubernetes.io/managed-by": "durable-sandbox", "durable-sandbox.dev/worker-key": "true"}


class WorkerKeyError(RuntimeError):
    """The worker key cannot be read (or written): what is wrong, where, and what to do."""


class WorkerKeyMissing(WorkerKeyError):
    """There is no worker key in the namespace yet (the operator writes it for the first spec.worker Workflow)."""


async def ensure_worker_key(api: KubeClient, namespace: str, journal_key: bytes) -> bool:
    """Secret ``namespace/durable-sandbox-worker-key`` holds ``namespace``'s key; True if it was written now."""
    want = base64.b64encode(namespace_key(journal_key, namespace)).decode()
    try:
        found: Any = await api.core.read_namespaced_secret(WORKER_KEY_SECRET, namespace)
    except ApiException as exc:
        if not is_not_found(exc):
            raise WorkerKeyError(_explain(exc, "read", namespace)) from None
        found = None
    if found is not None and (found.data or {}).get(_DATA_KEY) == want:
        return False
    body = m.V1Secret(metadata=m.V1ObjectMeta(name=WORKER_KEY_SECRET, labels=dict(_MANAGED)), type="Opaque",
                      data={_DATA_KEY: want})
    try:
        if found is None:
            await api.core.create_namespaced_secret(namespace, body)
        else:  # changed behind the operator's back: its workers' seals would fail; put the right one back
            body.metadata = m.V1ObjectMeta(name=WORKER_KEY_SECRET, labels=dict(_MANAGED),
                                           resource_version=found.metadata.resource_version)
            await api.core.replace_namespaced_secret(WORKER_KEY_SECRET, namespace, body)
    except ApiException as exc:
        if is_conflict(exc):
            return False  # another replica wrote it meanwhile (the same value: it is derived)
        raise WorkerKeyError(_explain(exc, "write", namespace)) from None
    return True


async def worker_key_handed(api: KubeClient, namespace: str) -> bool:
    """Whether ``namespace``'s key was handed to workers (its Secret exists): then a worker can seal its journal
    values as the operator does. A Secret of that name made by anyone counts too (it only makes callers careful).
    Not allowed to read it (403): the operator may not write it there either (the chart grants both only in
    ``workerNamespaces``), so it never handed the key there: False."""
    try:
        await api.core.read_namespaced_secret(WORKER_KEY_SECRET, namespace)
    except ApiException as exc:
        if is_not_found(exc) or exc.status == 403:
            return False
        raise WorkerKeyError(_explain(exc, "read", namespace)) from None
    return True


async def read_worker_key(api: KubeClient, namespace: str) -> bytes:
    """The worker key of ``namespace``, as a worker reads it with its own credentials."""
    try:
        secret: Any = await api.core.read_namespaced_secret(WORKER_KEY_SECRET, namespace)
    except ApiException as exc:
        if is_not_found(exc):
            raise WorkerKeyMissing(
                f"Secret {namespace}/{WORKER_KEY_SECRET} (the namespace's worker key) does not exist yet: the operator "
                f"writes it once a Workflow with spec.worker exists in {namespace}; create one, or check that the "
                f"operator runs and may create Secrets there.") from None
        raise WorkerKeyError(_explain(exc, "read", namespace)) from None
    try:
        key = base64.b64decode((secret.data or {}).get(_DATA_KEY) or "", validate=True)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise WorkerKeyError(f"Secret {namespace}/{WORKER_KEY_SECRET} has no usable key in data.{_DATA_KEY}; delete it "
                             f"and the operator writes it again.")
    return key


def _explain(exc: ApiException, verb: str, namespace: str) -> str:
    if exc.status == 403:
        return (f"may not {verb} Secret {namespace}/{WORKER_KEY_SECRET} (the namespace's worker key): the operator "
                f"needs get, create and update on it; a worker needs get on it (its Role, docs/kubernetes.md).")
    return f"cannot {verb} Secret {namespace}/{WORKER_KEY_SECRET} (the worker key): {exc.status} {exc.reason}"
