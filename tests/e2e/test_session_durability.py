"""Durable session calls through a real operator and API server, with the local provider (the node test,
``test_session_durability_node.py``, does it with Pods and S3): a Sandbox's sandbox lost mid-session (its files and
lease gone, as a deleted Pod's) is re-created by the controller from the newest snapshot the session calls took,
the calls after it are replayed, and the client sees no error. The lease is long (600 s): the controller learns
of the loss from the call's report (status.lossReported), not from its next renewal."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from durable_sandbox.client import SandboxClient
from durable_sandbox.providers.contract import SandboxHandle
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sessions.journal import calls_run_id
from durable_sandbox.sessions.rebuild import REBUILD
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import events, journal, namespace, operators
from tests.e2e.sandbox_support import sandbox, status, wait_for
from tests.e2e.session_caller_support import caller_token, start
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures


def test_a_lost_sandbox_is_restored_and_the_later_calls_replayed_unseen_by_the_client(
        control_plane: ControlPlane, namespace: str, operators: Any) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    op = start(operators, port)
    cp.apply(sandbox("box", snapshotEveryNCalls=3, leaseSeconds=600), "-n", ns)
    wait_for(cp, ns, "box", "Ready")
    uid = cp.kubectl_json("get", "dsbx", "box", "-n", ns)["metadata"]["uid"]
    token = caller_token(cp, ns, "agent", granted=True)
    with SandboxClient.attach("box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as client:
        for i in range(8):
            assert client.run(f"echo {i} >> f" + ("; exit 5" if i == 7 else ""), operation_id=f"c{i}").exit_code == (5 if i == 7 else 0)
        live = status(cp, ns, "box")
        asyncio.run(LocalProvider(home=op.home).inject_loss(SandboxHandle(id=live["providerId"], provider="local")))
        started = time.monotonic()
        answer = client.run("cat f", operation_id="c8")
        took = time.monotonic() - started
    assert answer.exit_code == 0 and answer.stdout == "".join(f"{i}\n" for i in range(8)), answer
    assert took < 120, f"the loss was noticed at the lease's renewal, not at the call's report ({took:.0f}s)"
    reasons = [e["reason"] for e in events(cp, ns, "box")]
    assert "SandboxLost" in reasons and "Recovered" in reasons, reasons
    rebuilt = [r for r in journal(cp, ns, calls_run_id(uid)) if r.op_id.startswith(REBUILD + "/") and r.result]
    assert [r.result["replayed"] for r in rebuilt if r.meta["from"] == 6] == [["c6", "c7"]]
    assert status(cp, ns, "box")["providerId"] != live["providerId"]
