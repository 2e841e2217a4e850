"""Worker heartbeats: a ``coordination.k8s.io/v1`` Lease per worker, ``dsb-worker-<queue>-<id>``, in the namespace
it serves, labelled with its queue, which the worker renews while it runs (``kube/workers/``).

The operator reads them for one thing only: to *say* that a run waits for a worker that is not there (the
``WaitingForWorker`` condition). Anyone who may write Leases in the namespace can make one, so nothing the
operator runs, claims or deletes ever depends on them (the run's own Lease, in the journal, decides who
executes it). A heartbeat is live while its ``renewTime`` plus ``leaseDurationSeconds`` (and a slack for clocks
that disagree) is not past; the notice may lag by that much.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from kubernetes.aio.client import models as m

from durable_sandbox.kube.api.client import KubeClient, is_conflict, is_not_found

__all__ = ["BUILD_LABEL", "CLOCK_SLACK", "QUEUE_LABEL", "Heartbeat", "heartbeat_name", "live_builds", "live_workers"]

QUEUE_LABEL = "durable-sandbox.dev/worker-queue"
BUILD_LABEL = "durable-sandbox.dev/worker-build"  # the worker's build id, when it has one (engine/builds.py)
CLOCK_SLACK = 5.0  # seconds: two machines' clocks may disagree
_MAX_NAME = 253


def heartbeat_name(queue: str, worker_id: str) -> str:
    """``dsb-worker-<queue>-<id>``, the id made a DNS subdomain."""
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in worker_id.lower()).strip("-.") or "worker"
    return f"dsb-worker-{queue}-{safe}"[:_MAX_NAME].rstrip("-.")


async def live_workers(api: KubeClient, namespace: str, queue: str, now: dt.datetime | None = None) -> list[str]:
    """The holders of the live heartbeats of ``queue`` in ``namespace`` (a notice, never a decision)."""
    return sorted(await live_builds(api, namespace, queue, now))


async def live_builds(api: KubeClient, namespace: str, queue: str,
                      now: dt.datetime | None = None) -> dict[str, str | None]:
    """The live heartbeats of ``queue`` in ``namespace``: holder -> the build it advertises (None: unversioned).
    A notice, never a decision."""
    leases: Any = await api.coordination.list_namespaced_lease(namespace, label_selector=f"{QUEUE_LABEL}={queue}")
    now = now or dt.datetime.now(dt.UTC)
    alive: dict[str, str | None] = {}
    for lease in leases.items or []:
        spec = lease.spec
        if spec is None or spec.renew_time is None or not spec.lease_duration_seconds or not spec.holder_identity:
            continue
        renewed = spec.renew_time if spec.renew_time.tzinfo else spec.renew_time.replace(tzinfo=dt.UTC)
        if (now - renewed).total_seconds() <= spec.lease_duration_seconds + CLOCK_SLACK:
            meta = getattr(lease, "metadata", None)
            alive[str(spec.holder_identity)] = (getattr(meta, "labels", None) or {}).get(BUILD_LABEL)
    return alive


@dataclass
class Heartbeat:
    """One worker's heartbeat Lease: :meth:`beat` creates or renews it, :meth:`stop` deletes it."""

    api: KubeClient
    namespace: str
    queue: str
    worker_id: str
    duration: int = 15
    build: str | None = None  # the worker's build id (engine/builds.py), said in BUILD_LABEL

    @property
    def name(self) -> str:
        return heartbeat_name(self.queue, self.worker_id)

    def _body(self, resource_version: str | None = None) -> m.V1Lease:
        now = dt.datetime.now(dt.UTC)
        return m.V1Lease(
            metadata=m.V1ObjectMeta(name=self.name, resource_version=resource_version,
                                    labels={QUEUE_LABEL: self.queue, "app.kubernetes.io/managed-by": "durable-sandbox",
                                            **({BUILD_LABEL: self.build} if self.build else {})}),
            spec=m.V1LeaseSpec(holder_identity=self.worker_id, lease_duration_seconds=self.duration,
                               renew_time=now, acquire_time=now),
        )

    async def beat(self) -> None:
        coordination = self.api.coordination
        try:
            found: Any = await coordination.read_namespaced_lease(self.name, self.namespace)
        except Exception as exc:
            if not is_not_found(exc):
                raise
            try:
                await coordination.create_namespaced_lease(self.namespace, self._body())
            except Exception as created:
                if not is_conflict(created):
                    raise
            return
        await coordination.replace_namespaced_lease(self.name, self.namespace,
                                                    self._body(found.metadata.resource_version))

    async def stop(self) -> None:
        try:
            await self.api.coordination.delete_namespaced_lease(self.name, self.namespace)
        except Exception as exc:
            if not is_not_found(exc):
                raise
