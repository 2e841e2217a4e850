"""The orphan sweep (kube/sweep/sweeper.py) as a task beside the operator: started once the operator serves, stopped
first when it stops, with the providers it built for its rounds."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.journal.worker_key import worker_key_handed
from durable_sandbox.kube.sandbox.checkpoints import session_snapshots
from durable_sandbox.kube.sweep.sweeper import OrphanSweeper
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.kube.workflow.controller import Operator
from durable_sandbox.providers.contract import SandboxProvider

__all__ = ["SweepTask"]

log = logging.getLogger("durable_sandbox.kube.handlers")

STOP_WAIT = 10.0  # seconds a round under way may take to end when the operator stops


class SweepTask:
    def __init__(self, task: asyncio.Task[None], stop: asyncio.Event, providers: dict[str, SandboxProvider]) -> None:
        self.task, self.stop_event, self.providers = task, stop, providers

    @classmethod
    def start(cls, api: KubeClient, op: Operator, namespaces: tuple[str, ...],
              metrics: OperatorMetrics) -> SweepTask | None:
        """The sweep every ``sweep_interval`` seconds (None when that is 0: off)."""
        settings = op.settings
        if settings.sweep_interval <= 0:
            return None
        cache: dict[str, SandboxProvider] = {}
        sweeper = OrphanSweeper(api, installation=settings.installation_id, namespaces=list(namespaces),
                                providers=lambda: _sweep_providers(op, cache), grace=settings.sweep_grace,
                                events=op.events, metrics=metrics, records=op.records,
                                finished_runs=op.engines.journals.finished_runs,
                                session_snapshots=lambda ns, uid: _session_snapshot_ids(op, ns, uid),
                                worker_keyed=lambda ns: worker_key_handed(api, ns))
        stop = asyncio.Event()
        log.info("orphan sweep every %gs (grace %gs) for installation %s", settings.sweep_interval,
                 settings.sweep_grace, settings.installation_id)
        return cls(asyncio.create_task(sweeper.run(settings.sweep_interval, stop)), stop, cache)

    async def stop(self) -> None:
        self.stop_event.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self.task, timeout=STOP_WAIT)
        for provider in self.providers.values():
            with contextlib.suppress(Exception):
                await provider.aclose()


async def _session_snapshot_ids(op: Operator, namespace: str, uid: str) -> frozenset[str]:
    return frozenset(s.snapshot_id for s in await session_snapshots(op.engines.journals, namespace, uid))


def _sweep_providers(op: Operator, cache: dict[str, SandboxProvider]) -> dict[str, SandboxProvider]:
    """The providers this operator may use and can build (configured), one instance each for all sweeps."""
    for name in op.engines.usable_provider_names():
        if name in cache:
            continue
        try:
            cache[name] = op.provider_for(name)
        except Exception as exc:  # a provider that cannot be built now is tried again next sweep
            log.warning("orphan sweep: provider %s unavailable (%s)", name, exc)
    return cache
