"""A worker's Prometheus metrics (``dsb worker --metrics-port``), served by
:mod:`durable_sandbox.kube.telemetry.metrics_server` like the operator's.

The counts come from the worker's store calls (``engine.observed_store.ObservedStore``) and, for runs left to
another build, from the worker loops. Every series carries the worker's build id and queue, two values fixed for
the process (empty: unversioned, or a local worker): never a run id, so the number of series stays bounded.
Every metric is listed in docs/operations.md ("A worker's metrics").
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, PlatformCollector, ProcessCollector, generate_latest

from durable_sandbox.kube.telemetry.metrics import PREFIX

__all__ = ["OUTCOMES", "WorkerMetrics"]

OUTCOMES = ("succeeded", "failed", "cancelled")  # a run's terminal statuses; always exported (as 0)


class WorkerMetrics:
    """One worker process's metrics in a registry of its own (a test or a second worker starts from zero);
    a ``WorkerObserver`` (engine/observed_store.py). ``generate()`` is the text exposition for ``/metrics``."""

    def __init__(self, *, build: str = "", queue: str = "", process_collectors: bool = True) -> None:
        self.registry = r = CollectorRegistry()
        if process_collectors:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        labels = {"build": build, "queue": queue}
        names = ["build", "queue"]
        self._claimed = Counter(
            f"{PREFIX}_worker_runs_claimed", "Runs this worker claimed and started executing (once per execution).",
            names, registry=r,
        ).labels(**labels)
        self._finished = Counter(
            f"{PREFIX}_worker_runs_finished", "Runs this worker finished, by outcome (succeeded, failed, cancelled).",
            [*names, "outcome"], registry=r,
        )
        for outcome in OUTCOMES:
            self._finished.labels(**labels, outcome=outcome)
        self._labels = labels
        self._steps = Counter(
            f"{PREFIX}_worker_steps_committed", "Step results (completed or failed) this worker committed.",
            names, registry=r,
        ).labels(**labels)
        self._renewals_failed = Counter(
            f"{PREFIX}_worker_lease_renewals_failed", "Lease renewals that failed without the lease being lost "
            "(the store away or refusing; retried until the lease's safety point).", names, registry=r,
        ).labels(**labels)
        self._leases_lost = Counter(
            f"{PREFIX}_worker_leases_lost", "Runs whose lease this worker found taken by another (a renewal or a "
            "fenced write refused): it stopped executing them without writing.", names, registry=r,
        ).labels(**labels)
        self._pinned = Counter(
            f"{PREFIX}_worker_runs_skipped_pinned", "Runs this worker left alone because they are pinned to another "
            "build (each counted once per worker).", names, registry=r,
        ).labels(**labels)

    def generate(self) -> bytes:
        return generate_latest(self.registry)

    # -- WorkerObserver ------------------------------------------------------------------------------

    def claimed(self) -> None:
        self._claimed.inc()

    def finished(self, outcome: str) -> None:
        self._finished.labels(**self._labels, outcome=outcome).inc()

    def steps_committed(self, count: int) -> None:
        self._steps.inc(count)

    def renewal_failed(self) -> None:
        self._renewals_failed.inc()

    def lease_lost(self) -> None:
        self._leases_lost.inc()

    def skipped_pinned(self) -> None:
        self._pinned.inc()
