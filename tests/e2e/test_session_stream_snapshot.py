"""Issue 35 through a real operator and API server (local provider): a shell call's output reaches the client while
the call runs (server-sent events from the operator's call API), a snapshot taken on request is the one a loss
restores (nothing replayed after it), and `dsb sandbox shell` runs each line once, the same --session-id again
answered from the journal."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

from durable_sandbox.client import CallResult, Output, SandboxClient
from durable_sandbox.providers.contract import SandboxHandle
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.sessions.journal import calls_run_id
from durable_sandbox.sessions.rebuild import REBUILD
from tests.dsb import DSB
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import journal, namespace, operators
from tests.e2e.sandbox_support import sandbox, status, wait_for
from tests.e2e.session_caller_support import caller_token, start
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures

WAITS = ("printf 'first\\n'; i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
         "if [ -e go ]; then echo second; else echo 'gave up'; fi")


def test_streamed_output_a_snapshot_on_request_and_the_shell_through_the_operator(
        control_plane: ControlPlane, namespace: str, operators: Any) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    op = start(operators, port)
    cp.apply(sandbox("box", leaseSeconds=600), "-n", ns)
    wait_for(cp, ns, "box", "Ready")
    uid = cp.kubectl_json("get", "dsbx", "box", "-n", ns)["metadata"]["uid"]
    token = caller_token(cp, ns, "agent", granted=True)
    url = f"http://127.0.0.1:{port}"
    local = LocalProvider(home=op.home)
    with SandboxClient.attach("box", namespace=ns, url=url, token=token) as box:
        workspace = local.workspace_path(status(cp, ns, "box")["providerId"])
        pieces: list[Output | CallResult] = []
        for piece in box.stream(WAITS, operation_id="s1"):
            pieces.append(piece)
            if piece == Output("stdout", "first\n"):
                assert not (workspace / "go").exists()  # the call still waits: its output came while it ran
                (workspace / "go").write_text("")
        assert pieces[0] == Output("stdout", "first\n") and isinstance(pieces[-1], CallResult)
        assert pieces[-1].stdout == "first\nsecond\n"

        box.write_file("kept.txt", "before the snapshot\n", operation_id="w1")
        taken = box.snapshot(operation_id="snap-1")
        assert taken.calls == 2 and box.snapshot(operation_id="snap-1").replayed
        lost = status(cp, ns, "box")["providerId"]
        asyncio.run(local.inject_loss(SandboxHandle(id=lost, provider="local")))
        assert box.read_file("kept.txt", operation_id="r1") == "before the snapshot\n"
    rows = journal(cp, ns, calls_run_id(uid))
    rebuilt = [r for r in rows if r.op_id.startswith(REBUILD + "/") and r.status == "completed" and (r.meta or {})["from"] == 2]
    assert [r.result["replayed"] for r in rebuilt] == [[]]  # restored from the snapshot asked for: nothing to replay

    env = {**os.environ, "DSB_SESSION_URL": url, "DSB_SESSION_TOKEN": token}
    lines = f"echo once >> {op.home}/effects.log\ncat kept.txt\n"
    shells = [subprocess.run([DSB, "-n", ns, "sandbox", "shell", "box", "--session-id", "sh"], input=lines, text=True,
                             capture_output=True, env=env, timeout=120) for _ in range(2)]
    assert [(s.returncode, s.stdout) for s in shells] == [(0, "before the snapshot\n")] * 2, shells
    assert Path(op.home, "effects.log").read_text() == "once\n"
