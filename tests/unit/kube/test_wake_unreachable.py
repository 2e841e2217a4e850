"""A parked run whose timer fires while the API server is away (a restart answering 503) is not an error.

Its task's first read of the Workflow failed and the task died: the replica counted a reconcile error and
parked the run for ``not_runnable_retry`` (30 s), so a restart slowed every run that woke during it by half a
minute (found by the chaos soak). Now such a run is parked again for a few ``claim_retry`` and read again."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.kube.workflow.controller import Operator, OperatorSettings
from durable_sandbox.kube.workflow.scheduler import TRANSIENT_WAKE_SPREAD
from tests.fakes.custom_objects import FakeCustomObjects

NS, NAME, UID = "team", "nightly", "0b5e1f2a-0000-4000-8000-000000000001"


def api_server(unavailable: int) -> FakeCustomObjects:
    """The API server's custom objects: answers 503 (an API server that has just started) ``unavailable``
    times, then 404 (the Workflow was deleted meanwhile, so the woken task ends without running anything)."""
    custom = FakeCustomObjects()
    custom.failures = [ApiException(status=503, reason="Service Unavailable") for _ in range(unavailable)]
    return custom


class Api:
    core = None  # no Event is written on this path
    away = ApiServerAway()  # no probe: reports are taken, nothing is said


def errors(metrics: OperatorMetrics) -> float:
    return metrics.reconcile_errors.labels(kind="Workflow")._value.get()


async def reads_reach(custom: FakeCustomObjects, count: int) -> None:
    while custom.reads() < count:
        custom.called.clear()
        await asyncio.wait_for(custom.called.wait(), 10)


async def test_a_run_woken_while_the_api_server_is_away_is_read_again_soon_and_counts_no_error() -> None:
    custom = api_server(unavailable=2)
    settings = OperatorSettings(claim_retry=0.02, not_runnable_retry=3600.0)
    metrics = OperatorMetrics(process_collectors=False)
    op = Operator(Api(), settings=settings, objects=custom, metrics=metrics)  # type: ignore[arg-type]
    run_id = cluster_run_id(NAME, UID)
    parks: list[tuple[str, float | None]] = []
    park = op.scheduler.park

    def recording_park(parked: Any, delay: float | None) -> None:
        parks.append((parked.reason, delay))
        park(parked, delay)

    op.scheduler.park = recording_park  # type: ignore[method-assign]
    before = errors(metrics)
    op.scheduler.activate(run_id, None, NS, NAME, UID)  # what a parked run's timer does (_due)
    # 503 (parked again, briefly); its timer fires: 503 again; and again: now the Workflow is found gone.
    await reads_reach(custom, 3)
    task = op.runs.active.get(run_id)
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), 10)
    assert custom.reads() == 3
    # Each time parked for a few claim_retry, not for not_runnable_retry (an hour here), and no error counted.
    assert [reason for reason, _ in parks] == ["api-unreachable", "api-unreachable"]
    assert all(delay is not None and delay <= settings.claim_retry * TRANSIENT_WAKE_SPREAD for _, delay in parks)
    assert run_id not in op.runs.parked and run_id not in op.runs.active
    assert errors(metrics) == before
