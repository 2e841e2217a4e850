"""`dsb --kube`: the same commands against a real API server, writing Workflow specs as kubectl would.

These need no operator: applying, signalling, cancelling and listing act on the Workflow objects, and the
API server's admission judges every write. (test_cli_kube_operator.py follows runs the operator executes.)
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.dsb import dsb
from tests.e2e.controlplane import wait_until

if TYPE_CHECKING:
    from .controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello-workflow.yaml"
CRD_NAMES = ["workflows.durable-sandbox.dev", "sandboxes.durable-sandbox.dev"]


@pytest.fixture
def ns(control_plane: ControlPlane) -> Iterator[str]:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    control_plane.kubectl("wait", "--for=condition=Established", *(f"crd/{n}" for n in CRD_NAMES), "--timeout=60s")
    name = f"kcli-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as on a wide terminal; KUBECONFIG is the control plane's (set by the fixture), as a user's shell
    would have it."""
    monkeypatch.setenv("COLUMNS", "200")


def coded(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "durable-sandbox.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {"entrypoint": "examples.flows.hello_flow:hello", "input": {"name": "ann", "approve": True}},
    }


def test_run_detach_applies_the_manifest_server_side(control_plane: ControlPlane, ns: str) -> None:
    proc = dsb("--kube", "-n", ns, "run", "--detach", str(HELLO), process=True)
    assert proc.returncode == 0, proc.stderr
    obj = control_plane.kubectl_json("get", "workflow", "hello", "-n", ns, "--show-managed-fields")
    run_id = f"hello-{obj['metadata']['uid'][:8]}"
    assert f"run {run_id} (Workflow/hello in namespace {ns}, applied)" in proc.stdout
    # Server-side apply by field manager dsb: no last-applied annotation (a big spec would not fit in one).
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert ("dsb", "Apply") in managers
    assert "kubectl.kubernetes.io/last-applied-configuration" not in obj["metadata"].get("annotations", {})
    manifest = yaml.safe_load(HELLO.read_text())
    assert obj["spec"]["toolCalls"] == manifest["spec"]["toolCalls"]
    # Applying again changes nothing and names the same run.
    again = dsb("--kube", "-n", ns, "run", "--detach", str(HELLO), "-o", "json", process=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == [{"runId": run_id, "workflow": "hello"}]
    after = control_plane.kubectl_json("get", "workflow", "hello", "-n", ns)
    assert after["metadata"]["generation"] == obj["metadata"]["generation"]


def test_an_invalid_manifest_is_refused_before_anything_is_applied(control_plane: ControlPlane, ns: str) -> None:
    bad = yaml.safe_load(HELLO.read_text())
    bad["spec"]["toolCalls"][0]["path"] = "/etc/passwd"
    proc = dsb("--kube", "-n", ns, "run", "-", input=yaml.safe_dump(bad), process=True)
    assert proc.returncode == 2, proc.stderr
    assert "spec.toolCalls[0].path" in proc.stderr
    assert control_plane.kubectl("get", "workflow", "hello", "-n", ns, check=False).returncode != 0


def test_signal_adds_to_spec_signals_once(control_plane: ControlPlane, ns: str) -> None:
    control_plane.apply(coded("approve"), "-n", ns)
    uid = control_plane.kubectl_json("get", "workflow", "approve", "-n", ns)["metadata"]["uid"]
    proc = dsb("--kube", "-n", ns, "signal", "approve", "approval", '{"ok": true}', process=True)
    assert proc.returncode == 0, proc.stderr
    assert "signalled approval of run approve" in proc.stdout
    assert f"dsb --kube -n {ns} logs -f approve" in proc.stdout  # no `resume`: the operator continues it
    # By run id, the same value again: nothing changes.
    proc = dsb("--kube", "-n", ns, "signal", f"approve-{uid[:8]}", "approval", '{"ok": true}', process=True)
    assert proc.returncode == 0 and "(already had this value)" in proc.stdout, proc.stderr
    proc = dsb("--kube", "-n", ns, "signal", "approve", "approval", '{"ok": false}', process=True)
    assert proc.returncode == 2 and "already signalled with a different value" in proc.stderr, proc.stderr
    proc = dsb("--kube", "-n", ns, "signal", "approve", "second/with~chars", "[1, 2]", process=True)
    assert proc.returncode == 0, proc.stderr
    spec = control_plane.kubectl_json("get", "workflow", "approve", "-n", ns)["spec"]
    assert spec["signals"] == {"approval": {"ok": True}, "second/with~chars": [1, 2]}
    assert dsb("--kube", "-n", ns, "signal", "approve", "x", "1", "--resume", process=True).returncode == 2


def test_cancel_sets_spec_cancel(control_plane: ControlPlane, ns: str) -> None:
    control_plane.apply(coded("stop-me"), "-n", ns)
    proc = dsb("--kube", "-n", ns, "cancel", "stop-me", process=True)
    assert proc.returncode == 0, proc.stderr
    assert "cancellation requested" in proc.stdout
    assert control_plane.kubectl_json("get", "workflow", "stop-me", "-n", ns)["spec"]["cancel"] is True


def test_runs_and_inspect_show_workflows_the_operator_has_not_started(control_plane: ControlPlane, ns: str) -> None:
    for name in ("first", "second"):
        control_plane.apply(coded(name), "-n", ns)
    uids = {n: control_plane.kubectl_json("get", "workflow", n, "-n", ns)["metadata"]["uid"] for n in ("first", "second")}
    proc = dsb("--kube", "-n", ns, "runs", "-o", "json", process=True)
    assert proc.returncode == 0, proc.stderr
    listed = {r["runId"]: r["status"] for r in json.loads(proc.stdout)}
    assert listed == {f"{n}-{u[:8]}": "pending" for n, u in uids.items()}
    proc = dsb("--kube", "-n", ns, "inspect", "first", "-o", "json", process=True)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    assert (state["runId"], state["status"]) == (f"first-{uids['first'][:8]}", "pending")
    # The namespace can also come after the command, as with kubectl.
    assert dsb("runs", "--kube", "-n", ns, "-o", "json", process=True).stdout == dsb("--kube", "-n", ns, "runs", "-o", "json", process=True).stdout


def test_unknown_names_and_local_only_commands_are_usage_errors(control_plane: ControlPlane, ns: str) -> None:
    proc = dsb("--kube", "-n", ns, "inspect", "nope", process=True)
    assert proc.returncode == 2 and f"No Workflow named 'nope' and none whose run id is 'nope' in namespace '{ns}'" in proc.stderr
    for args in (("resume", "nope"), ("worker",), ("run", "examples.flows.hello_flow:hello")):
        proc = dsb("--kube", "-n", ns, *args, process=True)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "--kube" in proc.stderr or "cluster" in proc.stderr, proc.stderr


def test_sandboxes_lists_the_sandbox_resources_with_phase_provider_ready_holder_and_age(
    control_plane: ControlPlane, ns: str
) -> None:
    # Just after the CRDs are applied the API server may answer 429 "storage is (re)initializing" for a while.
    wait_until(lambda: control_plane.kubectl("get", "dsbx", "-n", ns, check=False).returncode == 0, 60,
               "the Sandbox CRD to serve lists")
    proc = dsb("--kube", "-n", ns, "sandboxes", process=True)
    assert (proc.returncode, proc.stdout.strip()) == (0, "no Sandboxes in this namespace"), proc.stderr
    for name, provider in (("dev-box", "local"), ("cloud-box", "e2b")):
        control_plane.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name},
                             "spec": {"provider": provider}}, "-n", ns)
    # What the operator writes once the sandbox is live and a Workflow runs in it (no operator here: this
    # is about the listing, and the status subresource is the API the operator writes through).
    status = {"phase": "Ready", "providerId": "lsb-0123456789ab", "holder": "writer", "snapshots": ["lsnap-1"],
              "conditions": [{"type": "Ready", "status": "True", "reason": "SandboxReady", "message": "live",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    control_plane.kubectl("patch", "dsbx", "dev-box", "-n", ns, "--subresource=status", "--type=merge",
                          "-p", json.dumps({"status": status}))

    proc = dsb("--kube", "-n", ns, "sandboxes", "-o", "json", process=True)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert list(rows) == ["cloud-box", "dev-box"]
    assert {k: rows["dev-box"][k] for k in ("phase", "provider", "ready", "holder", "providerId", "snapshots")} == {
        "phase": "Ready", "provider": "local", "ready": "True", "holder": "writer", "providerId": "lsb-0123456789ab",
        "snapshots": ["lsnap-1"]}
    assert {k: rows["cloud-box"][k] for k in ("phase", "provider", "ready", "holder")} == {
        "phase": "Pending", "provider": "e2b", "ready": "Unknown", "holder": None}
    created = control_plane.kubectl_json("get", "dsbx", "dev-box", "-n", ns)["metadata"]["creationTimestamp"]
    assert rows["dev-box"]["createdAt"] == created
    assert yaml.safe_load(dsb("--kube", "-n", ns, "sandboxes", "-o", "yaml", process=True).stdout) == json.loads(proc.stdout)

    table = dsb("sandboxes", "--kube", "-n", ns, process=True).stdout.splitlines()
    rows_ = [[c.strip() for c in re.split("[│┃]", line)[1:-1]] for line in table if line.startswith(("│", "┃"))]
    assert rows_[0] == ["Name", "Phase", "Provider", "Ready", "Holder", "Age"], table
    cells = {row[0]: row for row in rows_[1:]}
    assert cells["dev-box"][1:5] == ["Ready", "local", "True", "writer"], table
    assert cells["cloud-box"][1:5] == ["Pending", "e2b", "Unknown", "-"], table
    assert cells["dev-box"][5].endswith(("s", "m")), table  # a few seconds old, as kubectl writes ages

    proc = dsb("sandboxes", "-n", ns, process=True)
    assert proc.returncode == 2 and "dsb --kube sandboxes" in proc.stderr, proc.stderr


def test_a_missing_namespace_is_one_line_that_says_what_to_do_and_exit_2(control_plane: ControlPlane, ns: str) -> None:
    missing = f"{ns}-missing"
    proc = dsb("--kube", "-n", missing, "run", "--detach", str(HELLO), process=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f'error: namespaces "{missing}" not found: create it (`kubectl create namespace '
                                  f'{missing}`) or choose another with -n'), proc.stderr
    assert proc.stderr.count("\n") == 1 and "ApiException" not in proc.stderr, proc.stderr
