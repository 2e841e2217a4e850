"""A Sandbox's own calls (issue 35, first slice): agents call a Sandbox through the call API that `dsb operator
--session-port` serves, with their own ServiceAccount token, one journaled call at a time.

Against the real API server (TokenReview and SubjectAccessReview for ServiceAccount tokens) with the local provider:
the client's calls, a retried operation id answered from the journal (a side-effect log shows it ran once), the
operator SIGKILLed before a call runs and after it is committed but before it is answered (the retry runs it once),
a Workflow holding the Sandbox (409), callers without the permission (401/403) for whom nothing runs, and the
Sandbox's lifecycle with the caller's own rights (suspend, resume, delete, create-or-attach: 403 without them).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from durable_sandbox.client import SandboxCallError, SandboxClient
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from tests.docs_commands import ROOT, commands_run_by
from tests.dsb import DSB
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    OperatorProcess,
    journal,
    manifest,
    namespace,
    operators,
)
from tests.e2e.operator_support import wait_condition as wait_workflow
from tests.e2e.sandbox_support import sandbox, set_suspend, status, wait_for
from tests.e2e.session_caller_support import CALLER_RULE, caller_token
from tests.e2e.session_caller_support import start as start_serving
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures

HOLD_SECONDS = "1"  # --session-hold-seconds (default 5): how long a session keeps the Sandbox after a call


def start(operators: Any, port: int, **kwargs: Any) -> OperatorProcess:
    """An operator serving the call API on ``port``, its sessions letting go of a Sandbox 1 s after their last call
    (the tests wait for that, and for what it allows: an idle suspend, a deletion)."""
    return start_serving(operators, port, "--session-hold-seconds", HOLD_SECONDS, **kwargs)

def ready_box(cp: ControlPlane, ns: str, operators: Any, port: int) -> str:
    """An operator serving the call API on ``port``, Sandbox ``box`` Ready, and a token of a ServiceAccount that may
    call it."""
    start(operators, port)
    cp.apply(sandbox("box"), "-n", ns)
    wait_for(cp, ns, "box", "Ready")
    return caller_token(cp, ns, "agent", granted=True)


def effects(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def call_rows(cp: ControlPlane, ns: str, uid: str, op: str) -> list[str]:
    return [r.status for r in journal(cp, ns, calls_run_id(uid)) if r.op_id == f"{SESSION}/{op}"]


def test_an_agent_calls_a_sandbox_once_per_operation_id(control_plane: ControlPlane, namespace: str, operators: Any,
                                                         tmp_path: Path) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    start(operators, port)
    cp.apply(sandbox("box"), "-n", ns)
    uid = wait_for(cp, ns, "box", "Ready") and cp.kubectl_json("get", "dsbx", "box", "-n", ns)["metadata"]["uid"]
    token = caller_token(cp, ns, "agent", granted=True)
    log = tmp_path / "effects.log"
    with SandboxClient.attach("box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as box:
        assert box.write_file("notes/a.txt", "hello\n").exit_code == 0
        first = box.run(f"echo c1 >> {log}; cat notes/a.txt", operation_id="c1")
        again = box.run(f"echo c1 >> {log}; cat notes/a.txt", operation_id="c1")
        assert (first.stdout, first.replayed, again.stdout, again.replayed) == ("hello\n", False, "hello\n", True)
        assert box.read_file("notes/a.txt") == "hello\n" and box.list("notes") == ["a.txt"]
        failed = box.run("echo to-stderr >&2; exit 3", cwd="notes", env={"TOKENISH": "s3cr3t-value"})
        assert (failed.exit_code, failed.stderr) == (3, "to-stderr\n")
    assert effects(log) == ["c1"]
    assert call_rows(cp, ns, uid, "c1") == ["started", "completed"]  # started before it runs (sessions/journal.py)
    # The journal keeps env names, never their values; the caller's token is nowhere the operator writes.
    written = json.dumps([cp.kubectl_json("get", kind, "-n", ns) for kind in ("journals", "events", "dsbx")])
    assert "s3cr3t-value" not in written and token not in written
    # The call journal goes with its Sandbox.
    cp.kubectl("delete", "dsbx", "box", "-n", ns, "--wait=true", "--timeout=90s")
    wait_until(lambda: not journal_objects(cp, ns, uid), 60, "the call journal to go with its Sandbox")


def journal_objects(cp: ControlPlane, ns: str, uid: str) -> list[str]:
    names = [o["metadata"]["name"] for o in cp.kubectl_json("get", "journals", "-n", ns)["items"]]
    return [n for n in names if uid in n and "calls" in n]


@pytest.mark.operator_log(r"killed|SIGKILL", why="the test kills replicas on purpose")
@pytest.mark.parametrize("point", ["before", "after"])
def test_a_call_interrupted_by_an_operator_kill_runs_once(control_plane: ControlPlane, namespace: str, operators: Any,
                                                          tmp_path: Path, point: str) -> None:
    """``before``: killed once the call's start is committed, before it runs; ``after``: killed once it ran and its
    result is committed, before the answer. Either way the client's retry (same operation id) makes it run once."""
    cp, ns, port = control_plane, namespace, free_port()
    first = start(operators, port, fault=f"{point}:{SESSION}/k1")
    cp.apply(sandbox("box"), "-n", ns)
    wait_for(cp, ns, "box", "Ready")
    uid = cp.kubectl_json("get", "dsbx", "box", "-n", ns)["metadata"]["uid"]
    token = caller_token(cp, ns, "agent", granted=True)
    log = tmp_path / "effects.log"
    with SandboxClient.attach("box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as box, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(box.run, f"echo k1 >> {log}; echo done", operation_id="k1")
        assert first.wait_exit(timeout=90) != 0  # the fault point killed it mid-call
        assert call_rows(cp, ns, uid, "k1") == (["started"] if point == "before" else ["started", "completed"])
        start(operators, port, home=first.home, name="operator-2")
        answer = pending.result(timeout=120)
        assert (answer.stdout, answer.replayed) == ("done\n", point == "after")
        assert box.run("true", operation_id="k2").exit_code == 0  # the session goes on
    assert effects(log) == ["k1"]
    assert call_rows(cp, ns, uid, "k1")[-1] == "completed"


def test_callers_without_the_permission_are_refused_and_nothing_runs(
        control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    op = start(operators, port)
    cp.apply(sandbox("box"), "-n", ns)
    wait_for(cp, ns, "box", "Ready")
    other = f"{ns}-other"
    cp.kubectl("create", "namespace", other)
    try:
        callers = {
            "no token": None,
            "another namespace's ServiceAccount": caller_token(cp, other, "agent", granted=True),
            "a ServiceAccount without the permission": caller_token(cp, ns, "stranger", granted=False),
            "a token the API server never issued": "not-a-token",
        }
        log = tmp_path / "effects.log"
        url = f"http://127.0.0.1:{port}/v1/namespaces/{ns}/sandboxes/box/shell"
        for who, token in callers.items():
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            answer = httpx.post(url, headers=headers, json={"operationId": "x1", "command": f"echo ran >> {log}"})
            expected = 401 if token in (None, "not-a-token") else 403
            assert answer.status_code == expected, (who, answer.text)
            error = answer.json()["error"]
            assert error["what"] and error["where"] and error["do"], who
            if expected == 403:
                assert "durable-sandbox-sandbox-caller" in error["do"]
        assert effects(log) == []
        uid = cp.kubectl_json("get", "dsbx", "box", "-n", ns)["metadata"]["uid"]
        assert journal_objects(cp, ns, uid) == []  # not even the call journal was made
        for token in callers.values():
            if token and token != "not-a-token":
                assert token not in op.logs()
    finally:
        cp.kubectl("delete", "namespace", other, "--wait=false")


def test_a_sandbox_held_by_a_workflow_refuses_session_calls(control_plane: ControlPlane, namespace: str,
                                                           operators: Any, tmp_path: Path) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    token = ready_box(cp, ns, operators, port)
    gate, log = tmp_path / "gate", tmp_path / "effects.log"
    cp.apply(manifest("writer", toolCalls=[{"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}],
                      sandbox=None, sandboxRef={"name": "box"}, snapshotEveryNCalls=None), "-n", ns)
    wait_until(lambda: status(cp, ns, "box").get("holder") == "writer", 60, "the Workflow to hold the Sandbox")
    with SandboxClient.attach("box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as box:
        with pytest.raises(SandboxCallError) as refused:
            box.run(f"echo s1 >> {log}", operation_id="s1")
        assert refused.value.status == 409 and "'writer'" in str(refused.value)
        assert effects(log) == []
        gate.touch()
        wait_workflow(cp, ns, "writer", "Succeeded")
        assert box.run(f"echo s1 >> {log}", operation_id="s1").exit_code == 0
    assert effects(log) == ["s1"]
    # The session keeps the Sandbox for --session-hold-seconds (HOLD_SECONDS) after its last call, then lets go.
    wait_until(lambda: not status(cp, ns, "box").get("holder"), 60, "the session to let go of the Sandbox")


def chart_caller_role() -> dict[str, Any]:
    """The chart's ClusterRole durable-sandbox-sandbox-caller, as its template writes it (its rules are plain YAML)."""
    text = (ROOT / "charts/durable-sandbox/templates/rbac.yaml").read_text()
    block = text.split("name: durable-sandbox-sandbox-caller", 1)[1].split("---", 1)[0]
    rules = yaml.safe_load(block.split("rules:", 1)[1])
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "durable-sandbox-sandbox-caller"}, "rules": rules}


def test_the_docs_commands_call_a_sandbox(control_plane: ControlPlane, namespace: str, operators: Any,
                                          tmp_path: Path) -> None:
    """docs/agents.md's commands, in order, in one shell (its exports carry on), in the test's namespace and port."""
    cp, ns, port = control_plane, namespace, free_port()
    assert chart_caller_role()["rules"] == [CALLER_RULE]
    cp.apply(chart_caller_role())
    op = start(operators, port)
    cp.apply(sandbox("dev-box"), "-n", ns)
    wait_for(cp, ns, "dev-box", "Ready")
    script = "\n".join(c.text for c in commands_run_by("tests/e2e/test_sandbox_sessions.py::"
                                                         "test_the_docs_commands_call_a_sandbox", "docs/agents.md"))
    script = script.replace("-n demo", f"-n {ns}").replace("demo:agent", f"{ns}:agent").replace("8443", str(port))
    path = f"{Path(cp.kubectl_bin).parent}{os.pathsep}{Path(DSB).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECONFIG": str(cp.kubeconfig), "PATH": path}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "hello", done.stdout  # after kubectl's "created" lines
    token = cp.kubectl("create", "token", "agent", "-n", ns).stdout.strip()
    with SandboxClient.attach("dev-box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as box:
        assert box.read_file("greeting.txt") == "hello\n"
    assert token not in op.logs()


def test_an_idle_suspended_sandbox_is_resumed_by_the_next_call(control_plane: ControlPlane, namespace: str,
                                                               operators: Any) -> None:
    """A session call counts as use for idleSuspendAfterSeconds; after the idle suspend, the next call takes the
    Sandbox, which resumes it from its snapshot, and runs once it is Ready: the files are intact."""
    cp, ns, port = control_plane, namespace, free_port()
    start(operators, port)
    cp.apply(sandbox("box", idleSuspendAfterSeconds=3), "-n", ns)
    first = wait_for(cp, ns, "box", "Ready")["providerId"]
    token = caller_token(cp, ns, "agent", granted=True)
    with SandboxClient.attach("box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as box:
        assert box.write_file("kept/notes.txt", "before the idle suspend\n").exit_code == 0
        suspended = wait_for(cp, ns, "box", "Suspended", timeout=120)
        assert not suspended.get("providerId")
        assert box.read_file("kept/notes.txt") == "before the idle suspend\n"
    resumed = status(cp, ns, "box")
    assert resumed["providerId"] and resumed["providerId"] != first
    wait_until(lambda: not status(cp, ns, "box").get("holder"), 60, "the session to let go of the Sandbox")


def test_a_sandbox_suspended_on_request_refuses_calls_until_resumed(control_plane: ControlPlane, namespace: str,
                                                                   operators: Any, tmp_path: Path) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    token = ready_box(cp, ns, operators, port)
    log = tmp_path / "effects.log"
    with SandboxClient.attach("box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as box:
        box.write_file("a.txt", "kept\n")
        set_suspend(cp, ns, "box", True)
        wait_for(cp, ns, "box", "Suspended")
        with pytest.raises(SandboxCallError) as refused:
            box.run(f"echo s1 >> {log}", operation_id="s1")
        assert refused.value.status == 409 and refused.value.error["where"].endswith("spec.suspend")
        assert effects(log) == [] and not status(cp, ns, "box").get("holder")
        set_suspend(cp, ns, "box", False)
        wait_for(cp, ns, "box", "Ready")
        assert box.run(f"echo s1 >> {log}; cat a.txt", operation_id="s1").stdout == "kept\n"
    assert effects(log) == ["s1"]


OWNER_RULES = [CALLER_RULE, {"apiGroups": ["durable-sandbox.dev"], "resources": ["sandboxes"],
                             "verbs": ["get", "create", "patch", "delete"]}]


def test_the_lifecycle_is_done_with_the_callers_own_rights(control_plane: ControlPlane, namespace: str,
                                                           operators: Any) -> None:
    """A caller that may only call the Sandbox may not suspend, delete or create one (403 from the API server
    itself, the request sent with its own token); one granted the chart's owner rules creates, suspends, resumes and
    deletes it through the client; no token is in the operator's log."""
    cp, ns, port = control_plane, namespace, free_port()
    op = start(operators, port)
    url = f"http://127.0.0.1:{port}"
    caller = caller_token(cp, ns, "agent", granted=True)
    cp.kubectl("create", "serviceaccount", "owner", "-n", ns)
    cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "owner"},
              "rules": OWNER_RULES}, "-n", ns)
    cp.kubectl("create", "rolebinding", "owner", "--role=owner", f"--serviceaccount={ns}:owner", "-n", ns)
    wait_until(lambda: cp.kubectl("auth", "can-i", "patch", "sandboxes.durable-sandbox.dev", "-n", ns,
                                  as_user=f"system:serviceaccount:{ns}:owner", check=False).returncode == 0,
               30, "RBAC to grant the owner")
    owner = cp.kubectl("create", "token", "owner", "-n", ns, "--duration=1h").stdout.strip()
    with pytest.raises(SandboxCallError) as refused:
        SandboxClient.create_or_attach("box", spec={"provider": "local"}, namespace=ns, url=url, token=caller)
    assert refused.value.status == 403 and "create sandboxes" in str(refused.value)
    with SandboxClient.create_or_attach("box", spec={"provider": "local"}, namespace=ns, url=url, token=owner,
                                        wait=120) as box:
        assert box.write_file("kept.txt", "kept\n").exit_code == 0
        with SandboxClient.attach("box", namespace=ns, url=url, token=caller) as agent:
            for refusal in (agent.suspend, agent.delete):
                with pytest.raises(SandboxCallError) as refused:
                    refusal()
                assert refused.value.status == 403 and "durable-sandbox-sandbox-owner" in str(refused.value)
        assert box.suspend()["suspended"] is True
        wait_for(cp, ns, "box", "Suspended", timeout=120)
        box.resume()
        assert box.wait_ready(timeout=120)["ready"]
        assert box.read_file("kept.txt") == "kept\n"
        box.delete()
    wait_until(lambda: cp.kubectl("get", "dsbx", "box", "-n", ns, check=False).returncode != 0, 120,
               "the Sandbox to be deleted")
    assert caller not in op.logs() and owner not in op.logs()
