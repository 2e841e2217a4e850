"""Waiting until a new sandbox Pod runs (or says why it never will), on a watch of that one Pod.

The provider made the Pod and holds the create's answer: its uid and resourceVersion. From that version it watches
the Pod by name (``fieldSelector=metadata.name=<name>``), so it sees the container start as soon as the API server
records it, with no polling interval in between (a backoff poll noticed a running Pod 55-323 ms late:
docs/benchmarks.md, "Where a claim's time goes"). The watch is bounded: by the provision's ready timeout, and, while
the Pod is unschedulable, by the unschedulable grace, so both fire without an event. A watch the API server ends
(its timeout, a compacted version: 410 Gone) is opened again from a fresh read.

**Identity** is the uid of the create's answer, never a label or the name: every object the watch (or a re-read)
shows is checked against it. A Pod of the same name with another uid (the sandbox's Pod deleted and a namesake made
by whoever may create Pods in the namespace) is never taken as running: the provision fails (retryable), and the
caller deletes only its own uid."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_sandbox.providers.contract import ProvisionError
from durable_sandbox.providers.kubernetes_connection import HOPELESS_REASONS, terminated_message

__all__ = ["PodStart", "pod_events", "start_state", "wait_running"]

_WATCH_SLICE_S = 60  # one watch request at most this long (the API server's own limit is longer)


@dataclass(frozen=True)
class PodStart:
    """Where a Pod's start is: ``running``, or ``unschedulable`` (the scheduler's message), or neither yet."""

    running: bool = False
    unschedulable: str | None = None


def start_state(pod: Mapping[str, Any]) -> PodStart:
    """Whether ``pod`` runs; raises :class:`ProvisionError` (not retryable) for a start that will not get better
    by waiting (an image that cannot be pulled, a container that ended, a Pod that ended)."""
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state and cs.get("ready", True) is not False:
            return PodStart(running=True)
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        if isinstance(reason, str) and reason in HOPELESS_REASONS:
            message = str(waiting.get("message") or "").strip()
            raise ProvisionError(
                f"Pod {namespace}/{name}: {reason}: {HOPELESS_REASONS[reason]}" + (f" ({message})" if message else "")
                + f"; image {cs.get('image')!r}: check the template's image, that it has /bin/sh, and "
                  f"that the node can pull it", retryable=False)
        terminated = state.get("terminated")
        if terminated:
            raise ProvisionError(terminated_message(str(namespace), str(name), terminated), retryable=False)
    if status.get("phase") in ("Failed", "Succeeded"):
        raise ProvisionError(f"Pod {namespace}/{name} ended ({status.get('phase')}: "
                             f"{status.get('reason') or status.get('message') or 'no reason given'})",
                             retryable=False)
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return PodStart(unschedulable=str(scheduled.get("message") or "no message"))
    return PodStart()


async def pod_events(core: Any, namespace: str, name: str, resource_version: str,
                     seconds: int) -> AsyncGenerator[dict[str, Any], None]:
    """The watch events (``{"type", "object"}``, plain JSON) of Pod ``namespace/name`` after ``resource_version``,
    for at most ``seconds``. An ERROR event raises :class:`ProvisionError` carrying its code (410: start again
    from a fresh read)."""
    from kubernetes.aio.client.exceptions import ApiException

    resp = await core.list_namespaced_pod_without_preload_content(
        namespace, field_selector=f"metadata.name={name}", resource_version=resource_version, watch=True,
        allow_watch_bookmarks=True, timeout_seconds=seconds, _request_timeout=seconds + 10)
    try:
        if resp.status >= 400:
            body = await resp.read()
            raise ApiException(status=resp.status, reason=resp.reason, body=body.decode(errors="replace"))
        while line := await resp.content.readline():
            event: dict[str, Any] = json.loads(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                error = ProvisionError(f"watch of Pod {namespace}/{name}: {status.get('code')}: "
                                       f"{status.get('message') or status.get('reason')}", retryable=True)
                error.code = status.get("code")  # type: ignore[attr-defined]
                raise error
            yield event
    finally:
        resp.close()  # mid-stream: the connection is dropped, not returned to the pool half-read


def _check_identity(pod: Mapping[str, Any] | None, namespace: str, name: str, uid: str, deleted: bool = False) -> None:
    """Raises unless ``pod`` is the provision's own Pod (``uid``), alive."""
    if pod is None or (deleted and (pod.get("metadata") or {}).get("uid") == uid):
        raise ProvisionError(f"Pod {namespace}/{name} was deleted while it started", retryable=True)
    meta = pod.get("metadata") or {}
    if meta.get("uid") != uid:
        raise ProvisionError(f"Pod {namespace}/{name} was replaced by another Pod of the same name (uid "
                             f"{meta.get('uid')}, not {uid}) while it started; that Pod is not used", retryable=True)
    if meta.get("deletionTimestamp"):
        raise ProvisionError(f"Pod {namespace}/{name} was deleted while it started", retryable=True)


async def wait_running(core: Any, pod: dict[str, Any], *, read: Callable[[], Awaitable[dict[str, Any] | None]],
                       ready_timeout: float, unschedulable_grace: float,
                       events: Callable[..., AsyncGenerator[dict[str, Any], None]] = pod_events) -> dict[str, Any]:
    """``pod`` (the create's answer) once its container runs, as the API server last showed it. Raises
    :class:`ProvisionError`: the Pod deleted or replaced (another uid) meanwhile (retryable), a hopeless start
    (not), unschedulable past ``unschedulable_grace`` (not), not running after ``ready_timeout`` (retryable)."""
    meta = pod["metadata"]
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    version = str(meta.get("resourceVersion") or "")
    deadline = time.monotonic() + ready_timeout
    unschedulable_since: float | None = None
    while True:
        _check_identity(pod, namespace, name, uid)
        state = start_state(pod)
        if state.running:
            return pod
        now = time.monotonic()
        if state.unschedulable is None:
            unschedulable_since = None
        else:
            unschedulable_since = unschedulable_since or now
            if now - unschedulable_since >= unschedulable_grace:
                raise ProvisionError(
                    f"Pod {namespace}/{name} cannot be scheduled: {state.unschedulable}; lower the template's "
                    f"resource requests or its nodeSelector/tolerations, or add capacity", retryable=False)
        if now >= deadline:
            status = pod.get("status") or {}
            raise ProvisionError(f"Pod {namespace}/{name} was not running after {ready_timeout:g}s "
                                 f"(phase {status.get('phase')}); see `kubectl describe pod -n {namespace} {name}`",
                                 retryable=True)
        until = deadline if unschedulable_since is None else min(deadline, unschedulable_since + unschedulable_grace)
        try:
            pod, version = await _watch_slice(core, pod, uid, version, max(1, min(_WATCH_SLICE_S, math.ceil(until - now))),
                                              events, unschedulable=unschedulable_since is not None)
        except ProvisionError as exc:
            if getattr(exc, "code", None) != 410:
                raise
            pod, version = await _reread(read, namespace, name, uid)  # too old a version to watch from
        else:
            if not start_state(pod).running and time.monotonic() < until:
                # The watch ended early and quietly (the API server's own limit): look again before watching on.
                pod, version = await _reread(read, namespace, name, uid)


async def _reread(read: Callable[[], Awaitable[dict[str, Any] | None]], namespace: str, name: str,
                  uid: str) -> tuple[dict[str, Any], str]:
    fresh = await read()
    _check_identity(fresh, namespace, name, uid)
    assert fresh is not None
    return fresh, str(fresh["metadata"].get("resourceVersion") or "")


async def _watch_slice(core: Any, pod: dict[str, Any], uid: str, version: str, seconds: int,
                       events: Callable[..., AsyncGenerator[dict[str, Any], None]], *,
                       unschedulable: bool) -> tuple[dict[str, Any], str]:
    """One watch request: the Pod as last seen and the version to go on from, at its end, at the first event that
    shows it running, or when it turns unschedulable (the grace then bounds the next watch)."""
    meta = pod["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    async with contextlib.aclosing(events(core, namespace, name, version, seconds)) as stream:
        async for event in stream:
            kind, obj = event.get("type"), event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind == "BOOKMARK":
                continue
            _check_identity(obj, namespace, name, uid, deleted=kind == "DELETED")
            pod = obj
            state = start_state(pod)  # a hopeless start raises here, at once
            if state.running or (state.unschedulable is not None and not unschedulable):
                break
    return pod, version
