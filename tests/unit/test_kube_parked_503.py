"""A parked run whose timer fires while the API server answers 503 (a restarted one does until it has installed
its paths: "the request has been made before all known HTTP paths have been installed") is looked at again
after ``claim_retry``, as the daemon's other API errors are: its first read of the Workflow used to crash the
run's task, which parked it as an error for ``not_runnable_retry`` (30 s). Found by the chaos soak with API
server restarts."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kubernetes.aio.client.exceptions import ServiceException

from durable_sandbox.kube.controller import Operator, OperatorSettings
from durable_sandbox.kube.plan import cluster_run_id


class NotReady:
    """``CustomObjectsApi`` of an API server that has just started: every read answers 503."""

    def __init__(self) -> None:
        self.reads = 0

    async def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        raise ServiceException(status=503, reason="Service Unavailable")


async def test_a_503_on_a_parked_runs_first_read_parks_it_for_claim_retry_not_the_error_backoff() -> None:
    custom = NotReady()
    settings = OperatorSettings(worker_id="w", claim_retry=1.0, not_runnable_retry=30.0, sweep_interval=0)
    op = Operator(SimpleNamespace(core=None, custom=custom), settings=settings)  # type: ignore[arg-type]
    run_id = cluster_run_id("wf", "0123456789abcdef")
    loop = asyncio.get_running_loop()

    op._activate(run_id, None, "ns", "wf", "0123456789abcdef")  # its timer fired: the task reads the object
    task = op._active[run_id]
    await asyncio.wait_for(asyncio.shield(task), 10)
    await asyncio.sleep(0)  # the task's done callback

    assert custom.reads == 1 and task.exception() is None
    parked = op._parked[run_id]
    assert parked.reason == "api-unreachable"
    assert parked.timer is not None and parked.timer.when() - loop.time() <= settings.claim_retry
    parked.timer.cancel()
