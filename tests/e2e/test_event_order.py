"""Issue 24, item 5: `kubectl describe` tells a Workflow's story in the order it happened.

The operator's Events used to carry whole-second timestamps (lastTimestamp), and kubectl orders by those: Events
of one second (a run's SnapshotTaken then SnapshotDeleted, a loss then its recovery) came out in the API server's
list order, which is by name, and the names were random. Here the operator's EventRecorder writes a dozen Events within a second
to a real API server, and `kubectl describe` must list them as they were written.
"""

from __future__ import annotations

import asyncio
import re

from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.reporting.events import EventRecorder, LifecycleEvent
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import manifest, namespace

__all__ = ["namespace"]  # fixtures

REASONS = [f"Step{i:02d}" for i in range(12)]


def test_describe_lists_the_operators_events_in_the_order_they_were_written(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp, ns = control_plane, namespace
    cp.apply(manifest("story"), "-n", ns)
    workflow = cp.kubectl_json("get", "workflow", "story", "-n", ns)

    async def write() -> None:
        api = await KubeClient.connect(kubeconfig=str(cp.kubeconfig))
        try:
            recorder = EventRecorder(api.core, instance="test-replica")
            for reason in REASONS:
                assert await recorder.emit(workflow, LifecycleEvent(reason, f"{reason} happened"))
        finally:
            await api.close()

    asyncio.run(write())
    described = cp.kubectl("describe", "workflow", "story", "-n", ns).stdout
    listed = re.findall(r"^\s+Normal\s+(Step\d\d)\b", described.split("Events:", 1)[1], re.MULTILINE)
    assert listed == REASONS, described
    stored = cp.kubectl_json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=story")["items"]
    assert all(e["eventTime"] and e["lastTimestamp"] and e["action"] for e in stored), stored
