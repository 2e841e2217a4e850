"""An object's Kubernetes Events as timeline entries (``dsb --kube ui``): a Workflow's beside its run's journal, a
Sandbox's beside its session calls' journal. Read with the viewer's kubeconfig; [] when it may not list Events."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

from durable_sandbox.kube.api.client import ApiException, json_body
from durable_sandbox.runs.cluster import ClusterEngine

__all__ = ["object_events", "parse_time"]


def parse_time(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def object_events(cluster: ClusterEngine, kind: str, obj: dict[str, Any],
                        skip: Collection[str] = ()) -> list[dict[str, Any]]:
    """The Events of ``obj`` (of ``kind``) as ``{uid, ts, reason, message, type, count}``, but those whose reason is in
    ``skip`` (what the journal already says) and those of an earlier object of the same name (another uid)."""
    named = obj["metadata"]
    selector = f"involvedObject.name={named['name']},involvedObject.kind={kind}"
    try:
        out = await json_body(cluster.api.core.list_namespaced_event_without_preload_content(
            cluster.namespace, field_selector=selector))  # fmt: skip
    except ApiException as exc:
        if exc.status in (401, 403):
            return []
        raise
    events = []
    for ev in out.get("items") or []:
        if (ev.get("involvedObject") or {}).get("uid") not in (None, named.get("uid")) or ev.get("reason") in skip:
            continue
        ts = (parse_time(ev.get("lastTimestamp")) or parse_time(ev.get("eventTime"))
              or parse_time(ev.get("firstTimestamp")) or parse_time(ev["metadata"].get("creationTimestamp")))  # fmt: skip
        if ts is None:
            continue
        events.append({"uid": ev["metadata"].get("uid"), "ts": ts, "reason": ev.get("reason"),
                       "message": ev.get("message"), "type": ev.get("type"), "count": ev.get("count")})  # fmt: skip
    return events
