"""Issue 13: the end of a run is one Event, however many replicas write it.

A replica that re-activates a finished run and sees its status stale (the executing replica died, or lost
the API server, before its status patch landed; or the patch is still on its way) writes the final status,
and wrote the `Succeeded` Event again: the operator-scale benchmark counted 202 for 200 runs on two replicas.
Here replica A runs a Workflow to the end and records its Event; its status is then set back as if A's last
patch had not landed, and replica B, started on the finished run, writes the status again and tries the
Event: the API server keeps the first one (it has a name derived from the run), so there is exactly one.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    events,
    manifest,
    namespace,
    operators,
    replica_of,
    scrape,
    status,
    total,
    wait_condition,
)
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures


def succeeded_events(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    return [e for e in events(cp, ns, name) if e.get("reason") == "Succeeded"]


def test_a_second_replica_on_a_finished_run_writes_no_second_succeeded_event(
    control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    cp, ns = control_plane, namespace
    a = operators("--allow-local-provider", name="replica-a")
    cp.apply(manifest("once"), "-n", ns)
    wait_condition(cp, ns, "once", "Succeeded")
    wait_until(lambda: succeeded_events(cp, ns, "once"), 60, "replica A's Succeeded Event")
    a.stop()

    # As if A's last status patch had not landed: the status says Running.
    cp.kubectl("patch", "workflow", "once", "-n", ns, "--subresource=status", "--type=merge",
               "-p", '{"status":{"phase":"Running"}}')
    port = free_port()
    operators("--allow-local-provider", "--metrics-port", str(port), name="replica-b")

    def b_wrote_status_and_event() -> bool:
        if status(cp, ns, "once").get("phase") != "Succeeded":
            return False
        try:
            got = scrape(port)
        except AssertionError:
            return False  # not serving /metrics yet
        return total(got, "durable_sandbox_kube_api_requests_total", verb="create", resource="events") >= 1

    wait_until(b_wrote_status_and_event, 90, "replica B to write the final status and its Succeeded Event")
    written = succeeded_events(cp, ns, "once")
    assert len(written) == 1, [(e["metadata"]["name"], e.get("reportingInstance")) for e in written]
    assert replica_of(written[0].get("reportingInstance")) == "replica-a"  # <worker-id>:<per-start nonce>
    assert written[0].get("count") == 1
