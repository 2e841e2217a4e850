"""Issue 35: the example agent (examples/client_agent) against a real operator and API server, with the local
provider: the operator SIGKILLed mid-session (a fault point, once a call's start is committed and before it runs)
and the Sandbox's sandbox lost while it is down; a second operator takes over, the agent's client sends the call
again with the same operation id, and the agent finishes with the same transcript and the same workspace as an
undisturbed run of it, every call run once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from typing import Any

from examples.client_agent import run_agent

from durable_sandbox.client import SandboxClient
from durable_sandbox.providers.contract import SandboxHandle
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import journal, namespace, operators
from tests.e2e.sandbox_support import sandbox, status, wait_for
from tests.e2e.session_caller_support import caller_token, start
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures

WORKSPACE = "find . -type f | LC_ALL=C sort | xargs sha256sum"


def same_place(steps: list[tuple[str, dict[str, Any], str]]) -> list[tuple[str, dict[str, Any], str]]:
    """The steps with the sandbox's own directory (in a traceback's paths) named alike: it is all that differs."""
    return [(tool, args, re.sub(r"/workspaces/[^/]+/", "/workspaces/SANDBOX/", text)) for tool, args, text in steps]


def test_the_example_agent_survives_an_operator_kill_and_a_sandbox_loss(
        control_plane: ControlPlane, namespace: str, operators: Any) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    # Step 3 is the agent's first test run: the operator dies with its start committed, before it runs.
    first = start(operators, port, fault=f"before:{SESSION}/disturbed-3")
    for name in ("box", "calm"):
        cp.apply(sandbox(name, snapshotEveryNCalls=2, leaseSeconds=600), "-n", ns)
    for name in ("box", "calm"):
        wait_for(cp, ns, name, "Ready")
    uid = cp.kubectl_json("get", "dsbx", "box", "-n", ns)["metadata"]["uid"]
    token = caller_token(cp, ns, "agent", granted=True)
    url = f"http://127.0.0.1:{port}"
    with SandboxClient.attach("box", namespace=ns, url=url, token=token, retry_for=240) as box, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(run_agent, box, "disturbed")
        assert first.wait_exit(timeout=120) != 0  # killed mid-call by the fault point
        lost = status(cp, ns, "box")["providerId"]
        asyncio.run(LocalProvider(home=first.home).inject_loss(SandboxHandle(id=lost, provider="local")))
        start(operators, port, home=first.home, name="operator-2")
        disturbed = pending.result(timeout=300)
        disturbed_files = box.run(WORKSPACE, operation_id="check").stdout
    with SandboxClient.attach("calm", namespace=ns, url=url, token=token) as calm:
        undisturbed = run_agent(calm, "calm")
        undisturbed_files = calm.run(WORKSPACE, operation_id="check").stdout
    assert same_place(disturbed.steps) == same_place(undisturbed.steps) and "tests passed" in disturbed.last
    assert disturbed_files == undisturbed_files and "calc.py" in disturbed_files
    assert status(cp, ns, "box")["providerId"] != lost  # replaced, and the calls before it replayed into it
    rows = journal(cp, ns, calls_run_id(uid))
    completed = [r.op_id for r in rows if r.op_id.startswith(f"{SESSION}/disturbed-") and r.status == "completed"]
    assert sorted(completed) == sorted({*completed}) and len(completed) == len(disturbed.steps)  # each once
