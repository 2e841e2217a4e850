"""The operator process as one object (issue 34): the application ``dsb operator`` hands to kopf starts on fakes,
without kopf, reconciles a Workflow, stops by its own stop path, and leaves nothing behind it; two in one process
share nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf
import pytest

from durable_sandbox.kube import handlers
from durable_sandbox.kube.api.resources import WORKFLOWS
from durable_sandbox.kube.process.application import NotServing, OperatorApplication
from durable_sandbox.kube.process.process_config import OperatorConfig
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.kube.workflow.controller import OperatorSettings
from tests.fakes.custom_objects import FakeCustomObjects
from tests.fakes.kube_client import FakeKubeClient

NS, NAME, UID = "team", "nightly", "0b5e1f2a-0000-4000-8000-000000000034"


def invalid_workflow() -> dict[str, Any]:
    """A Workflow admission refuses (a tool call of no known type): reconciling it is writing Failed and why."""
    return {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
            "metadata": {"namespace": NS, "name": NAME, "uid": UID, "generation": 1, "resourceVersion": "1"},
            "spec": {"toolCalls": [{"type": "teleport"}]}}


def config() -> OperatorConfig:
    return OperatorConfig(settings=OperatorSettings(sweep_interval=0), metrics_port=0, metrics_host="127.0.0.1")


async def until(custom: FakeCustomObjects, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (by the fake's calls, with a deadline) until ``condition`` holds."""
    async with asyncio.timeout(timeout):
        while not condition():
            custom.called.clear()
            await custom.called.wait()


async def get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status, await resp.text()


async def test_the_application_starts_without_kopf_reconciles_a_workflow_and_closes_everything() -> None:
    custom = FakeCustomObjects({(WORKFLOWS, NS, NAME): invalid_workflow()})
    api = FakeKubeClient()
    app = OperatorApplication(config(), metrics=OperatorMetrics(process_collectors=False))
    with pytest.raises(NotServing):
        _ = app.workflows
    await app.start(api, objects=custom)  # type: ignore[arg-type]
    assert app.readiness.problem is None and set(api.custom.listed) >= {"workflows", "sandboxes", "sandboxpools"}
    server = app.metrics_server
    assert server is not None and await get(server.port, "/readyz") == (200, "ok\n")

    # What kopf's watch does: call the handler with the memo `kube.handlers.run` gave kopf.
    memo = kopf.Memo({handlers.MEMO_KEY: app})
    await handlers.watched(body=invalid_workflow(), type=None, memo=memo)  # type: ignore[arg-type]
    stored = custom.objects[(WORKFLOWS, NS, NAME)]
    await until(custom, lambda: (stored.get("status") or {}).get("phase") == "Failed")
    failed = next(c for c in stored["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec" and "teleport" in failed["message"]
    assert [e["reason"] for e in api.core.events] == ["InvalidSpec"]
    assert 'durable_sandbox_workflows{phase="Pending"} 1.0' in app.metrics.generate().decode()

    await app.close()
    assert api.closed and app.stopped and app.metrics_server is None
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(server.port, "/healthz")
    app.workflow_event(invalid_workflow(), deleted=True)  # a watch event after the close is no error


async def test_a_signal_hands_the_runs_over_then_stops_kopf_and_a_second_stops_at_once() -> None:
    app = OperatorApplication(config(), metrics=OperatorMetrics(process_collectors=False))
    await app.start(FakeKubeClient(), objects=FakeCustomObjects())  # type: ignore[arg-type]
    app.begin_stop("SIGTERM")
    assert app.readiness.problem == "stopping: handing runs over to other replicas"
    await asyncio.wait_for(app.stop_flag.wait(), 10)  # kopf is told to stop once the runs were handed over
    assert app.workflows.stopping
    await app.close()

    quick = OperatorApplication(config(), metrics=OperatorMetrics(process_collectors=False))
    quick.begin_stop("SIGTERM")
    quick.begin_stop("SIGINT")
    assert quick.stop_flag.is_set()
    await asyncio.wait_for(quick.stop_flag.wait(), 10)


async def test_an_operator_kopf_does_not_serve_stops_saying_why_once() -> None:
    app = OperatorApplication(config(), metrics=OperatorMetrics(process_collectors=False))
    app.stop_unserved("kopf does not serve this operator's resources: first")
    app.stop_unserved("kopf does not serve this operator's resources: second")
    await asyncio.wait_for(app.stop_flag.wait(), 10)
    assert app.unserved == "kopf does not serve this operator's resources: first"


def test_a_handler_without_the_application_in_its_memo_says_how_to_start_the_operator() -> None:
    with pytest.raises(RuntimeError, match=r"start the operator with kube.handlers.run\(app\)"):
        handlers.application(kopf.Memo())


def test_two_applications_share_nothing() -> None:
    one, two = OperatorApplication(config()), OperatorApplication(config())
    assert one.metrics is not two.metrics and one.metrics.registry is not two.metrics.registry
    assert one.readiness is not two.readiness and one.away is not two.away and one.stop_flag is not two.stop_flag
    one.readiness.ready()
    assert two.readiness.problem == "starting"
