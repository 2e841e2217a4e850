"""Deleting what the kubernetes provider made, by identity: a Pod by its name *and* uid (a delete precondition,
so a Pod someone re-created under the same name is never the one deleted; its env Secret, owned by that uid, goes
with it by the cluster's garbage collector), and an Event on the Pod for every deletion and every refusal, so both
are seen where people look (``kubectl get events``), not only in the operator's log.

``core`` is a ``kubernetes.aio`` CoreV1Api (or a fake of its ``*_without_preload_content`` calls).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["delete_pod", "pod_event"]

log = logging.getLogger("durable_sandbox.providers.kubernetes")
_COMPONENT = "durable-sandbox"


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


async def _body(call: Any, *, parse: bool = True) -> dict[str, Any]:
    from durable_sandbox.providers.kubernetes_api import json_body  # kubernetes.aio: loaded on first use

    return await json_body(call, parse=parse)


async def delete_pod(core: Any, namespace: str, name: str, uid: str) -> bool:
    """Delete Pod ``namespace/name`` if its uid is ``uid``; False when there is none, or it is another Pod."""
    try:
        # A short grace: the keep-alive ends on SIGTERM at once; calls still running are killed with it.
        await _body(core.delete_namespaced_pod_without_preload_content(
            name, namespace, grace_period_seconds=1, propagation_policy="Background",
            body={"preconditions": {"uid": uid}}), parse=False)
    except Exception as exc:
        if _status(exc) in (404, 409):  # gone, or the name is another Pod's now: not ours to delete
            return False
        raise
    return True


async def pod_event(core: Any, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
    """An Event about ``pod`` (never fails the caller: an Event that cannot be written is logged)."""
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name,
                           "uid": meta.get("uid", "")},
        "reason": reason, "message": message[:1024], "type": kind, "count": 1,
        "firstTimestamp": now, "lastTimestamp": now, "source": {"component": _COMPONENT},
        "reportingComponent": _COMPONENT, "reportingInstance": _COMPONENT,
    }
    try:
        await _body(core.create_namespaced_event_without_preload_content(namespace, body), parse=False)
    except Exception as exc:
        log.warning("kubernetes: cannot write Event %s about Pod %s/%s: %s", reason, namespace, name,
                    _status(exc) or type(exc).__name__)
