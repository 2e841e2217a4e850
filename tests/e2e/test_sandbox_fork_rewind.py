"""Issue 36 against the real API server (TokenReview and SubjectAccessReview for ServiceAccount tokens), with the
local provider: a Sandbox's session rewound through the call API (403 without update on the Sandbox; the workspace
after the point; the next call continuing there; status.lastRewind and `dsb --kube history sandbox/NAME`), and a
Sandbox made with docs/forks.md's `spec.from` manifest (the source's first calls; each with snapshots of its own;
the source deleted, the fork goes on; spec.from fixed at creation; deleted in either order, each snapshot deleted
once by its owner, never one still needed, and nothing left)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_sandbox.client import SandboxCallError, SandboxClient
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.sessions.journal import SESSION, calls_run_id
from tests.docs_commands import ROOT
from tests.dsb import DSB
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import journal, local_sandboxes, namespace, operators
from tests.e2e.sandbox_support import sandbox, status, wait_for
from tests.e2e.session_caller_support import CALLER_RULE, caller_token, start
from tests.ports import free_port

__all__ = ["namespace", "operators"]  # fixtures

UPDATE_RULE = {"apiGroups": ["durable-sandbox.dev"], "resources": ["sandboxes"], "verbs": ["update"]}


def grant_update(cp: ControlPlane, ns: str, sa: str) -> None:
    cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": f"{sa}-owner"},
              "rules": [CALLER_RULE, UPDATE_RULE]}, "-n", ns)
    cp.kubectl("create", "rolebinding", f"{sa}-owner", f"--role={sa}-owner", f"--serviceaccount={ns}:{sa}", "-n", ns)
    wait_until(lambda: cp.kubectl("auth", "can-i", "update", "sandboxes.durable-sandbox.dev", "-n", ns,
                                  as_user=f"system:serviceaccount:{ns}:{sa}", check=False).returncode == 0,
               30, f"RBAC to grant {sa} update")


def notes(box: SandboxClient, op: str) -> list[str]:
    return box.read_file("notes.txt", operation_id=op).splitlines()


def uid_of(cp: ControlPlane, ns: str, name: str) -> str:
    return str(cp.kubectl_json("get", "dsbx", name, "-n", ns)["metadata"]["uid"])


def history(cp: ControlPlane, ns: str, name: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig), "COLUMNS": "250"}
    ran = subprocess.run([DSB, "--kube", "-n", ns, "-o", "wide", "history", f"sandbox/{name}"], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def snapshots(cp: ControlPlane, ns: str, uid: str) -> set[str]:
    """The snapshots a Sandbox's session holds now (taken and not deleted), from its journal."""
    return {c.snapshot_id for c in SessionState.derive(SESSION, journal(cp, ns, calls_run_id(uid))).checkpoints}


def restored_fork(cp: ControlPlane, ns: str, url: str, token: str, home: Path, source_snapshots: set[str]) -> None:
    """Sandbox at-5, a fork of dev-box (5 calls, its snapshot at 4) after call 5 (sessions/fork_restore.py): its
    fresh sandbox is replaced by the controller from its own copy of that snapshot, and only step-4 is replayed;
    deleting it deletes its copy and nothing of its source's."""
    cp.apply(sandbox("at-5", **{"from": {"sandbox": "dev-box", "afterCall": 5}}), "-n", ns)
    wait_for(cp, ns, "at-5", "Ready")
    with SandboxClient.attach("at-5", namespace=ns, url=url, token=token) as at5:
        at5.run("echo try 5 >> notes.txt", operation_id="try-5")
        assert notes(at5, "look-5") == [f"step {i}" for i in range(5)] + ["try 5"]
    uid = uid_of(cp, ns, "at-5")
    rows = journal(cp, ns, calls_run_id(uid))
    assert [r.result["replayed"] for r in rows if r.op_id.startswith("rebuild/") and r.status == "completed"] == [
        ["step-4"]]
    copies = snapshots(cp, ns, uid)
    assert len(copies) == 1 and not copies & source_snapshots
    cp.kubectl("delete", "dsbx", "at-5", "-n", ns, "--wait=true", "--timeout=90s")
    kept = set(local_sandboxes(home))
    assert {f"local/snapshots/{s}.tar" for s in source_snapshots} <= kept
    assert not {f"local/snapshots/{s}.tar" for s in copies} & kept


def docs_fork_manifest() -> dict[str, Any]:
    doc = (ROOT / "docs" / "forks.md").read_text()
    [found] = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "from:" in block]
    return dict(found)


def test_a_sandbox_session_is_rewound_through_the_call_api(control_plane: ControlPlane, namespace: str,
                                                          operators: Any) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    start(operators, port)
    cp.apply(sandbox("box", snapshotEveryNCalls=3), "-n", ns)
    wait_for(cp, ns, "box", "Ready")
    uid = uid_of(cp, ns, "box")
    token = caller_token(cp, ns, "agent", granted=True)
    with SandboxClient.attach("box", namespace=ns, url=f"http://127.0.0.1:{port}", token=token) as box:
        for i in range(8):
            box.run(f"echo step {i} >> notes.txt", operation_id=f"step-{i}")
        with pytest.raises(SandboxCallError) as denied:  # may call it, may not update it
            box.rewind(5)
        assert denied.value.status == 403 and "update sandboxes" in str(denied.value)
        grant_update(cp, ns, "agent")
        done = box.rewind(5)
        assert done["rewound"] == ["step-5", "step-6", "step-7"] and done["toCall"] == 5
        assert notes(box, "look-1") == [f"step {i}" for i in range(5)]
        box.run("echo another way >> notes.txt", operation_id="alt-6")
        with pytest.raises(SandboxCallError) as reused:
            box.run("echo again >> notes.txt", operation_id="step-6")
        assert reused.value.status == 409 and "rewound" in str(reused.value)
        assert notes(box, "look-2") == [*(f"step {i}" for i in range(5)), "another way"]
    shown = status(cp, ns, "box").get("lastRewind") or {}
    assert shown.get("toCall") == 5 and shown.get("rewound") == ["step-5", "step-6", "step-7"]
    rows = journal(cp, ns, calls_run_id(uid))
    assert [r.status for r in rows if r.op_id == f"{SESSION}/step-7"] == ["started", "completed"]  # kept
    assert "rewound to after call 5: 3 call(s) rewound" in history(cp, ns, "box")


@pytest.mark.parametrize("first", ["source", "fork"])
def test_a_sandbox_made_from_another_starts_with_its_calls_and_outlives_it(
        control_plane: ControlPlane, namespace: str, operators: Any, first: str) -> None:
    cp, ns, port = control_plane, namespace, free_port()
    home = start(operators, port).home
    cp.apply(sandbox("dev-box", snapshotEveryNCalls=2), "-n", ns)
    wait_for(cp, ns, "dev-box", "Ready")
    token = caller_token(cp, ns, "agent", granted=True)
    url = f"http://127.0.0.1:{port}"
    with SandboxClient.attach("dev-box", namespace=ns, url=url, token=token) as box:
        for i in range(5):
            box.run(f"echo step {i} >> notes.txt", operation_id=f"step-{i}")
    fork = docs_fork_manifest()
    cp.apply(fork, "-n", ns)
    name = fork["metadata"]["name"]
    wait_for(cp, ns, name, "Ready")
    refused = cp.kubectl("patch", "dsbx", name, "-n", ns, "--type=merge", "-p",
                         '{"spec":{"from":{"sandbox":"dev-box","afterCall":1}}}', check=False)
    assert refused.returncode != 0 and "spec.from cannot change after creation" in refused.stderr
    source_uid, fork_uid = uid_of(cp, ns, "dev-box"), uid_of(cp, ns, name)
    with SandboxClient.attach(name, namespace=ns, url=url, token=token) as forked:
        forked.run("echo try 2 >> notes.txt", operation_id="try-2")
        assert notes(forked, "look-1") == ["step 0", "step 1", "step 2", "try 2"]
        [origin] = [r for r in journal(cp, ns, calls_run_id(fork_uid)) if r.op_id == f"{SESSION}/from/1"]
        assert origin.meta == {"sandbox": "dev-box", "uid": source_uid, "afterCall": 3}
        own = {"dev-box": snapshots(cp, ns, source_uid), name: snapshots(cp, ns, fork_uid)}
        assert own["dev-box"] and own[name] and not own["dev-box"] & own[name]  # each its own
        if first == "source":  # a fork at 5 restores its copy of the source's snapshot at 4: one call replayed
            restored_fork(cp, ns, url, token, home, own["dev-box"])
        order = ["dev-box", name] if first == "source" else [name, "dev-box"]
        cp.kubectl("delete", "dsbx", order[0], "-n", ns, "--wait=true", "--timeout=90s")
        kept = set(local_sandboxes(home))
        assert {f"local/snapshots/{s}.tar" for s in own[order[1]]} <= kept  # none still needed deleted
        assert not {f"local/snapshots/{s}.tar" for s in own[order[0]]} & kept  # the deleted one's all gone
        if first == "source":  # the fork needs nothing of its source's any more
            forked.run("echo after >> notes.txt", operation_id="after")
            assert notes(forked, "look-2")[-1] == "after"
    cp.kubectl("delete", "dsbx", order[1], "-n", ns, "--wait=true", "--timeout=90s")
    wait_until(lambda: not local_sandboxes(home), 60, "no sandbox or snapshot of either left")
    wait_until(lambda: not [o for o in cp.kubectl_json("get", "journals", "-n", ns)["items"]
                            if source_uid in o["metadata"]["name"] or fork_uid in o["metadata"]["name"]],
               60, "both call journals to go with their Sandboxes")


def test_the_docs_manifest_is_a_valid_fork(tmp_path: Path) -> None:
    from durable_sandbox.kube.spec.models import SandboxResource

    parsed = SandboxResource.model_validate(docs_fork_manifest())
    assert parsed.spec.from_ is not None and parsed.spec.from_.after_call == 3


def workflow(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
            "spec": {"sandbox": {"provider": "local"}, **spec}}


def phase(cp: ControlPlane, ns: str, name: str, want: str) -> dict[str, Any]:
    wait_until(lambda: wf_status(cp, ns, name).get("phase") in (want, "Failed", "Succeeded"), 120, f"{name} {want}")
    st = wf_status(cp, ns, name)
    assert st.get("phase") == want, st
    return st


def wf_status(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    got = cp.kubectl_json("get", "workflow", name, "-n", ns)
    return dict(got.get("status") or {})


def test_a_workflow_fork_of_runs_its_tail_from_the_sources_call_n(control_plane: ControlPlane, namespace: str,
                                                                  operators: Any) -> None:
    """docs/forks.md's forkOf: the source's retained snapshot (after call 4) copied and the copy restored, call 5
    replayed, then the fork's own tail; a point past the source's calls refused (ForkPointNotReached); forkOf fixed
    at creation; all deleted, nothing left."""
    cp, ns = control_plane, namespace
    home = start(operators, free_port()).home
    calls = [{"type": "shell", "command": f"echo {i} >> log.txt"} for i in range(5)]
    cp.apply(workflow("src", toolCalls=calls, snapshotEveryNCalls=2, retainLatestSnapshot=True), "-n", ns)
    phase(cp, ns, "src", "Succeeded")
    fork = docs_fork_of_manifest()
    cp.apply(fork, "-n", ns)
    name = fork["metadata"]["name"]
    st = phase(cp, ns, name, "Succeeded")
    assert st["result"]["toolResults"][-1]["stdout"] == "0\n1\n2\n3\n4\ntry 2\n"
    assert st["calls"]["total"] == 7
    uid = str(cp.kubectl_json("get", "workflow", "src", "-n", ns)["metadata"]["uid"])
    rows = journal(cp, ns, f"{name}-{cp.kubectl_json('get', 'workflow', name, '-n', ns)['metadata']['uid'][:8]}")
    [head] = [r for r in rows if r.op_id == "fork"]
    assert head.meta is not None and (head.meta["workflow"], head.meta["uid"]) == ("src", uid)
    # Restored from its own copy of the source's retained snapshot (snapshot_copy), never the source's object.
    assert [r.status for r in rows if r.op_id == "sandbox/snapshot/copy-4"] == ["started", "completed"]
    refused = cp.kubectl("patch", "workflow", name, "-n", ns, "--type=merge", "-p",
                         '{"spec":{"forkOf":{"workflow":"src","afterCall":1}}}', check=False)
    assert refused.returncode != 0 and "spec.forkOf cannot change after creation" in refused.stderr
    cp.apply(workflow("too-far", forkOf={"workflow": "src", "afterCall": 9},
                      toolCalls=[{"type": "shell", "command": "true"}]), "-n", ns)
    failed = phase(cp, ns, "too-far", "Failed")
    assert "afterCall is 9, but Workflow 'src'" in str(failed), failed
    for gone in ("src", name, "too-far"):
        cp.kubectl("delete", "workflow", gone, "-n", ns, "--wait=true", "--timeout=90s")
    wait_until(lambda: not local_sandboxes(home), 60, "no sandbox or snapshot of source or fork left")


def docs_fork_of_manifest() -> dict[str, Any]:
    doc = (ROOT / "docs" / "forks.md").read_text()
    [found] = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "forkOf:" in block]
    return dict(found)
