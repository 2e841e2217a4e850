"""The trust boundary, tried as the red team tried it (issue 20): three impersonated namespace users against a
real operator serving two tenants' namespaces, each attempt repeated here and shown to change nothing the
operator runs, believes or deletes.

- ``author``: may create, edit and delete Workflows and Sandboxes in tenant A; may not read Secrets.
- ``cm-editor``: may edit ConfigMaps in tenant A (as the built-in ``edit`` role may) and read Workflows.
- ``status-patcher``: may patch the status of Workflows and Sandboxes in tenant A, and read them.

Tenant B has a Workflow whose snapshot it kept (``retainLatestSnapshot``) and a Sandbox with a live sandbox: the
things another tenant would like to read, use or destroy. The operator uses the local provider (one shared
home: every tenant's sandboxes and snapshots are reachable by id, which is what makes the attempts real).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.kube.store import run_key
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    OperatorProcess,
    condition,
    event_reasons,
    events,
    local_sandboxes,
    manifest,
    namespace,
    operators,
    status,
    wait_condition,
    wait_gone,
)

__all__ = ["namespace", "operators"]  # fixtures

AUTHOR, CM_EDITOR, STATUS_PATCHER = "author", "cm-editor", "status-patcher"

ROLES: dict[str, list[dict[str, Any]]] = {
    AUTHOR: [
        {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows", "sandboxes"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    ],
    CM_EDITOR: [
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows"], "verbs": ["get", "list", "watch"]},
    ],
    STATUS_PATCHER: [
        {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows/status", "sandboxes/status"],
         "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows", "sandboxes"], "verbs": ["get", "list"]},
    ],
}


@dataclass
class Tenants:
    cp: ControlPlane
    a: str
    b: str
    op: OperatorProcess
    effects: Path  # a side-effect log outside every sandbox: one line per executed call

    def as_user(self, user: str, *args: str, check: bool = False) -> Any:
        return self.cp.kubectl(*args, as_user=user, check=check)

    def apply(self, user: str, ns: str, doc: dict[str, Any]) -> None:
        proc = self.cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc), as_user=user, check=False)
        assert proc.returncode == 0, proc.stderr

    def sandbox(self, ns: str, name: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name},
                "spec": {"provider": "local", **spec}}

    def sandbox_status(self, ns: str, name: str) -> dict[str, Any]:
        proc = self.cp.kubectl("get", "sandbox", name, "-n", ns, "-o", "json", check=False)
        return (json.loads(proc.stdout).get("status") or {}) if proc.returncode == 0 else {}

    def wait_sandbox(self, ns: str, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
        wait_until(lambda: self.sandbox_status(ns, name).get("phase") == phase, timeout,
                   f"Sandbox {ns}/{name} to be {phase} (status: {self.sandbox_status(ns, name)})")
        return self.sandbox_status(ns, name)

    def lines(self) -> list[str]:
        return self.effects.read_text().split("\n")[:-1] if self.effects.exists() else []


@pytest.fixture
def tenants(control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> Iterator[Tenants]:
    cp = control_plane
    b = f"tenant-b-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", b)
    for user, rules in ROLES.items():
        cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                  "metadata": {"name": user, "namespace": namespace}, "rules": rules})
        cp.kubectl("create", "rolebinding", user, "-n", namespace, f"--role={user}", f"--user={user}")
    wait_until(lambda: cp.kubectl("auth", "can-i", "patch", "workflows.durable-sandbox.dev", "--subresource=status",
                                  "-n", namespace, "--as", STATUS_PATCHER, check=False).returncode == 0,
               30, "the tenants' RoleBindings to take effect")
    op = operators("--allow-local-provider", "--workflows", "examples.flows", "--namespace", b)
    try:
        yield Tenants(cp, namespace, b, op, tmp_path / "effects.log")
    finally:
        cp.kubectl("delete", "namespace", b, "--wait=false", "--ignore-not-found")


def _tenant_b_secrets(t: Tenants) -> tuple[str, str]:
    """Tenant B's retained snapshot (of a Workflow that succeeded) and its Sandbox's live sandbox id."""
    t.cp.apply(manifest("keeper", toolCalls=[{"type": "write_file", "path": "secret.txt", "contents": "b's secret\n"}],
                        snapshotEveryNCalls=1, retainLatestSnapshot=True), "-n", t.b)
    t.cp.apply(t.sandbox(t.b, "b-box"), "-n", t.b)
    wait_condition(t.cp, t.b, "keeper", "Succeeded")
    snapshot = status(t.cp, t.b, "keeper")["latestSnapshot"]
    live = t.wait_sandbox(t.b, "b-box", "Ready")["providerId"]
    assert snapshot and live
    return snapshot, live


# --------------------------------------------------------------------------------------------- cm-editor


def test_a_configmap_editor_can_neither_rewrite_a_run_nor_forge_its_approval(tenants: Tenants) -> None:
    t = tenants
    gate = {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": "gate"},
            "spec": {"entrypoint": "examples.flows.approval_gate:approval_gate",
                     "input": {"name": "real", "effects": str(t.effects)}}}
    t.apply(AUTHOR, t.a, gate)
    wait_condition(t.cp, t.a, "gate", "WaitingForSignal")
    run_id = status(t.cp, t.a, "gate")["runId"]
    head = f"dsb.{run_key(run_id)}"

    # Nothing of the run is a ConfigMap any more, and the run's own objects are out of the editor's reach.
    listed = t.as_user(CM_EDITOR, "get", "configmaps", "-n", t.a, "-l", "durable-sandbox.dev/run-id", "-o", "json",
                       check=True)
    assert json.loads(listed.stdout)["items"] == []
    for verb in (("get", "journal", head), ("delete", "journal", head),
                 ("patch", "journal", head, "--type=merge", "-p", '{"data":{"signals":"{}"}}')):
        refused = t.as_user(CM_EDITOR, *verb, "-n", t.a)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), (verb, refused.stderr)
    # What the editor can do: make ConfigMaps that look like the old journal, with a forged program and approval.
    forged = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": head, "labels": {"durable-sandbox.dev/run-id": run_key(run_id),
                                                    "durable-sandbox.dev/part": "run"}},
              "data": {"run.input": json.dumps({"name": "forged", "effects": str(t.effects)}),
                       "signals": json.dumps({"approve": {"by": "intruder"}}), "run.status": '"pending"'}}
    made = t.cp.kubectl("apply", "-n", t.a, "-f", "-", input=json.dumps(forged), as_user=CM_EDITOR, check=False)
    assert made.returncode == 0, made.stderr

    # The approver's real answer goes through the Workflow's spec, is not refused, and is the one the run used;
    # an operator restart changes nothing.
    t.op.stop()
    t.op.start()
    patched = t.as_user(AUTHOR, "patch", "workflow", "gate", "-n", t.a, "--type=merge", "-p",
                        '{"spec":{"signals":{"approve":{"by":"alice"}}}}')
    assert patched.returncode == 0, patched.stderr
    wait_condition(t.cp, t.a, "gate", "Succeeded")
    result = status(t.cp, t.a, "gate")["result"]
    assert result["approved"] == {"by": "alice"}
    assert t.lines() == ["prepared real", "applied real"], "only the Workflow's own commands ran, each once"
    assert "SignalConflict" not in event_reasons(t.cp, t.a, "gate")


# --------------------------------------------------------------------------------------------- status-patcher


def test_a_status_patcher_cannot_make_the_operator_delete_or_use_another_tenants_things(tenants: Tenants) -> None:
    t = tenants
    snapshot_b, live_b = _tenant_b_secrets(t)
    before = set(local_sandboxes(t.op.home))
    assert f"local/snapshots/{snapshot_b}" in before or any(snapshot_b in s for s in before), before

    # A Workflow of tenant A, its status rewritten to name tenant B's snapshot and sandbox, then deleted.
    t.apply(AUTHOR, t.a, manifest("victim", toolCalls=[{"type": "shell", "command": "echo a"}]))
    wait_condition(t.cp, t.a, "victim", "Succeeded")
    forged = {"status": {"latestSnapshot": snapshot_b, "sandbox": {"provider": "local", "providerId": live_b},
                         "journal": [{"name": "dsb.nothing"}], "runId": "keeper-00000000"}}
    patched = t.as_user(STATUS_PATCHER, "patch", "workflow", "victim", "-n", t.a, "--subresource=status",
                        "--type=merge", "-p", json.dumps(forged))
    assert patched.returncode == 0, patched.stderr
    # The same for a Sandbox of tenant A: its status names tenant B's live sandbox.
    t.apply(AUTHOR, t.a, t.sandbox(t.a, "a-box"))
    t.wait_sandbox(t.a, "a-box", "Ready")
    patched = t.as_user(STATUS_PATCHER, "patch", "sandbox", "a-box", "-n", t.a, "--subresource=status",
                        "--type=merge", "-p", json.dumps({"status": {"providerId": live_b, "snapshots": [snapshot_b],
                                                                     "holder": "nobody"}}))
    assert patched.returncode == 0, patched.stderr
    # A Workflow attached to a-box runs in a-box's own sandbox, never in the one status names.
    t.apply(AUTHOR, t.a, manifest("uses-a-box", sandbox=None, sandboxRef={"name": "a-box"},
                                  toolCalls=[{"type": "write_file", "path": "written-by-a.txt", "contents": "a\n"}],
                                  snapshotEveryNCalls=0))
    wait_condition(t.cp, t.a, "uses-a-box", "Succeeded")
    assert not (t.op.home / "local" / "workspaces" / live_b / "written-by-a.txt").exists()

    for kind, name in (("workflow", "uses-a-box"), ("workflow", "victim"), ("sandbox", "a-box")):
        done = t.cp.kubectl("delete", kind, name, "-n", t.a, "--timeout=120s", check=False, timeout=150)
        assert done.returncode == 0, done.stderr
    after = set(local_sandboxes(t.op.home))
    assert {s for s in before if snapshot_b in s or live_b in s} <= after, "tenant B's snapshot and sandbox are intact"
    # ...and tenant B can still use them.
    t.cp.apply(manifest("reader", sandbox=None, sandboxRef={"name": "b-box"},
                        toolCalls=[{"type": "shell", "command": "echo still here"}]), "-n", t.b)
    wait_condition(t.cp, t.b, "reader", "Succeeded")


# --------------------------------------------------------------------------------------------- author


def test_a_workflow_author_cannot_restore_another_namespaces_snapshot(tenants: Tenants) -> None:
    t = tenants
    snapshot_b, _ = _tenant_b_secrets(t)
    t.apply(AUTHOR, t.a, t.sandbox(t.a, "thief", fromSnapshot=snapshot_b))
    wait_until(lambda: t.sandbox_status(t.a, "thief").get("phase") == "Failed", 90,
               f"the Sandbox restoring another namespace's snapshot to be refused ({t.sandbox_status(t.a, 'thief')})")
    st = t.sandbox_status(t.a, "thief")
    assert not st.get("providerId"), "nothing was restored"
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "SnapshotNotOwned" and snapshot_b in ready["message"]
    assert "SnapshotNotOwned" in [e["reason"] for e in events(t.cp, t.a, "thief")]
    # Its own namespace's snapshot is fine: a retained snapshot of a Workflow of tenant A.
    t.apply(AUTHOR, t.a, manifest("own", toolCalls=[{"type": "write_file", "path": "mine.txt", "contents": "mine\n"}],
                                  snapshotEveryNCalls=1, retainLatestSnapshot=True))
    wait_condition(t.cp, t.a, "own", "Succeeded")
    t.apply(AUTHOR, t.a, t.sandbox(t.a, "restored", fromSnapshot=status(t.cp, t.a, "own")["latestSnapshot"]))
    t.wait_sandbox(t.a, "restored", "Ready")


def test_an_entrypoint_cannot_attach_to_a_sandbox_another_workflow_holds(tenants: Tenants) -> None:
    t = tenants
    gate = t.effects.parent / "gate"
    t.apply(AUTHOR, t.a, t.sandbox(t.a, "shared"))
    t.wait_sandbox(t.a, "shared", "Ready")
    holder_calls = [{"type": "shell", "command": f"echo holder-start >> {t.effects}"},
                    {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo holder-end >> {t.effects}"}]
    t.apply(AUTHOR, t.a, manifest("holder", sandbox=None, sandboxRef={"name": "shared"}, toolCalls=holder_calls,
                                  snapshotEveryNCalls=0))
    wait_until(lambda: t.sandbox_status(t.a, "shared").get("holder") == "holder", 60, "the holder to hold the Sandbox")
    wait_until(lambda: t.lines() == ["holder-start"], 60, "the holder's first call")
    intruder = {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": "intruder"},
                "spec": {"entrypoint": "durable_sandbox.workflows.sandbox_agent:sandbox_agent",
                         "input": {"sandboxRef": {"name": "shared"},
                                   "toolCalls": [{"type": "shell", "command": f"echo INTRUDER >> {t.effects}"}]}}}
    t.apply(AUTHOR, t.a, intruder)
    wait_until(lambda: (condition(t.cp, t.a, "intruder", "Ready") or {}).get("reason") in ("WaitingForSandbox",)
               or status(t.cp, t.a, "intruder").get("phase") == "Failed", 90,
               f"the intruder to wait for the Sandbox or be refused ({status(t.cp, t.a, 'intruder')})")
    gate.touch()
    wait_condition(t.cp, t.a, "holder", "Succeeded")
    assert t.lines()[:2] == ["holder-start", "holder-end"], "nothing ran in the holder's sandbox while it held it"


def test_inputs_that_would_block_deletion_are_bounded_and_everything_deletes(tenants: Tenants) -> None:
    t = tenants
    long_name = "s" * 70
    t.apply(AUTHOR, t.a, t.sandbox(t.a, long_name))
    box = t.wait_sandbox(t.a, long_name, "Ready")["providerId"]
    t.apply(AUTHOR, t.a, {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
                          "metadata": {"name": "big-signal"},
                          "spec": {"entrypoint": "examples.flows.approval_gate:approval_gate",
                                   "input": {"name": "big"}}})
    wait_condition(t.cp, t.a, "big-signal", "WaitingForSignal")
    huge = t.effects.parent / "huge-signal.json"  # a 1 MB argument is over the kernel's limit: a patch file
    huge.write_text(json.dumps({"spec": {"signals": {"approve": "x" * 1_000_000}}}))
    patched = t.as_user(AUTHOR, "patch", "workflow", "big-signal", "-n", t.a, "--type=merge", "--patch-file", str(huge))
    assert patched.returncode == 0, patched.stderr
    wait_until(lambda: "SignalRefused" in event_reasons(t.cp, t.a, "big-signal"), 60, "the refusal's Event")
    # The Event is emitted as the refusal is seen; the condition follows with the next status publish.
    wait_until(lambda: "spec.signals.approve" in (condition(t.cp, t.a, "big-signal", "WaitingForSignal")
                                                   or {}).get("message", ""), 60, "the refusal in the condition")
    waiting = condition(t.cp, t.a, "big-signal", "WaitingForSignal")
    assert waiting is not None and waiting["status"] == "True" and "was refused" in waiting["message"]
    for kind, name in (("workflow", "big-signal"), ("sandbox", long_name)):
        done = t.cp.kubectl("delete", kind, name, "-n", t.a, "--timeout=120s", check=False, timeout=150)
        assert done.returncode == 0, (kind, done.stderr)
    assert [s for s in local_sandboxes(t.op.home) if box in s] == [], "the long-named Sandbox's sandbox is gone"


@pytest.mark.apiserver_journal(
    "the journal key's seal on Journal objects; PostgreSQL's rows are not sealed: who may write them is the "
    "database's access control, out of every namespace user's reach (docs/operations.md)"
)
def test_a_journal_changed_behind_the_operators_back_fails_the_run_visibly_and_it_still_deletes(
    tenants: Tenants,
) -> None:
    t = tenants
    t.apply(AUTHOR, t.a, {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow",
                          "metadata": {"name": "edited"},
                          "spec": {"entrypoint": "examples.flows.approval_gate:approval_gate",
                                   "input": {"name": "edited", "effects": str(t.effects),
                                             "hibernateAfterSeconds": 3600}}})
    wait_condition(t.cp, t.a, "edited", "WaitingForSignal")
    run_id = status(t.cp, t.a, "edited")["runId"]
    head = f"dsb.{run_key(run_id)}"
    live = [s for s in local_sandboxes(t.op.home) if "workspaces" in s]
    assert live, "the waiting run keeps its sandbox (hibernateAfterSeconds)"
    # A cluster administrator (not a namespace user: none may) edits the run's recorded input.
    data = t.cp.kubectl_json("get", "journal", head, "-n", t.a)["data"]
    forged = data["run.input"].replace('"edited"', '"forged"')
    t.cp.kubectl("patch", "journal", head, "-n", t.a, "--type=merge", "-p", json.dumps({"data": {"run.input": forged}}))
    t.as_user(AUTHOR, "patch", "workflow", "edited", "-n", t.a, "--type=merge", "-p",
              '{"spec":{"signals":{"approve":true}}}', check=True)
    wait_condition(t.cp, t.a, "edited", "Failed")
    failed = condition(t.cp, t.a, "edited", "Failed")
    assert failed is not None and failed["reason"] == "JournalTampered" and head in failed["message"]
    wait_until(lambda: "JournalTampered" in event_reasons(t.cp, t.a, "edited"), 60, "the JournalTampered Event")
    assert "applied" not in " ".join(t.lines()) and "forged" not in " ".join(t.lines())
    done = t.cp.kubectl("delete", "workflow", "edited", "-n", t.a, "--timeout=120s", check=False, timeout=150)
    assert done.returncode == 0, done.stderr
    wait_gone(t.cp, t.a, "edited")
    assert [s for s in local_sandboxes(t.op.home) if s in live] == [], "its sandbox is destroyed by its owner tag"


# --------------------------------------------------------------------------------------------- replicas


def test_two_replicas_started_with_the_same_worker_id_never_run_a_call_twice(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    """Issue 20, item 2: a lease holder's identity carries a per-start nonce, so two processes given the same
    ``--worker-id`` (the chart does not, ``extraArgs`` can) are two holders: never both in one run's lease."""
    effects = tmp_path / "effects.log"
    replicas = [operators("--allow-local-provider", "--worker-id", "same", name=name) for name in ("r-a", "r-b")]
    names = [f"twin-{i}" for i in range(6)]
    for name in names:
        # Calls that take a moment: long enough for the other replica to look at the run's lease meanwhile
        # (before the nonce it saw its own name there, took the run over, and both executed it).
        calls = [{"type": "shell", "command": f"sleep 0.5; echo {name}-{c} >> {effects}"} for c in range(3)]
        control_plane.apply(manifest(name, toolCalls=calls, snapshotEveryNCalls=0), "-n", namespace)
    for name in names:
        wait_condition(control_plane, namespace, name, "Succeeded", timeout=240)
    lines = effects.read_text().split()
    assert sorted(lines) == sorted(f"{n}-{c}" for n in names for c in range(3)), "every call exactly once"
    assert all(r.alive() for r in replicas)
    assert all("same:" in r.logs() for r in replicas), "each replica's identity is the name and its own nonce"
