"""The committed CRDs at a real API server: installed with kubectl, the example manifest is accepted, and every
admission rule rejects a bad manifest at `kubectl apply` with its message."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from durable_sandbox.kube import crds

if TYPE_CHECKING:
    from .conftest import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
HELLO = ROOT / "examples" / "hello-workflow.yaml"
CRD_NAMES = ["workflows.durable-sandbox.dev", "sandboxes.durable-sandbox.dev"]


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> None:
    # The committed files, exactly as docs/kubernetes.md installs them.
    control_plane.kubectl("apply", "-f", str(CRD_DIR))
    control_plane.kubectl(
        "wait", "--for=condition=Established", *(f"crd/{n}" for n in CRD_NAMES), "--timeout=60s"
    )


@pytest.fixture
def namespace(control_plane: ControlPlane, installed: None) -> Iterator[str]:
    name = f"crds-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def hello() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(HELLO.read_text())
    return manifest


def with_spec(name: str, **changes: Any) -> dict[str, Any]:
    manifest = hello()
    manifest["metadata"]["name"] = name
    for key, value in changes.items():
        if value is None:
            manifest["spec"].pop(key, None)
        else:
            manifest["spec"][key] = value
    return manifest


def with_call(name: str, call: dict[str, Any]) -> dict[str, Any]:
    return with_spec(name, toolCalls=[call])


def apply(control_plane: ControlPlane, namespace: str, manifest: dict[str, Any], *args: str) -> Any:
    return control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", *args, input=json.dumps(manifest), check=False
    )


def test_crds_are_established_with_their_names(control_plane: ControlPlane, installed: None) -> None:
    for crd in control_plane.kubectl_json("get", "crd", *CRD_NAMES)["items"]:
        established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert established["Established"] == "True"
        assert established["NamesAccepted"] == "True"
    discovery = json.loads(control_plane.kubectl("get", "--raw", "/apis/durable-sandbox.dev/v1alpha1").stdout)
    names = {r["name"]: r for r in discovery["resources"]}
    assert names["workflows"]["shortNames"] == ["dwf"]
    assert names["sandboxes"]["shortNames"] == ["dsbx"]
    assert names["workflows"]["namespaced"] and names["sandboxes"]["namespaced"]
    assert "workflows/status" in names and "sandboxes/status" in names


def test_hello_workflow_is_accepted_and_listed_with_printer_columns(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl("apply", "-n", namespace, "-f", str(HELLO))
    table = control_plane.kubectl("get", "dwf", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "CALLS", "SNAPSHOT", "AGE"]
    assert table[1].split()[0] == "hello"

    control_plane.kubectl(
        "patch", "dwf", "hello", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Running", "calls": {"completed": 3, "total": 4},
                                     "latestSnapshot": "snap-2"}}),
    )  # fmt: skip
    row = control_plane.kubectl("get", "dwf", "hello", "-n", namespace, "--no-headers").stdout.split()
    assert row[:4] == ["hello", "Running", "3", "snap-2"]


def test_sandbox_is_accepted_and_listed_with_printer_columns(
    control_plane: ControlPlane, namespace: str
) -> None:
    sandbox = {
        "apiVersion": "durable-sandbox.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "shared"},
        "spec": {"provider": "local", "leaseSeconds": 600, "env": [{"name": "A", "value": "1"}]},
    }
    assert apply(control_plane, namespace, sandbox).returncode == 0
    control_plane.kubectl(
        "patch", "dsbx", "shared", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Ready", "providerId": "p-1"}}),
    )  # fmt: skip
    table = control_plane.kubectl("get", "dsbx", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PROVIDER", "AGE"]
    assert table[1].split()[:3] == ["shared", "Ready", "local"]

    bad = copy.deepcopy(sandbox)
    bad["metadata"]["name"] = "bad-env"
    bad["spec"]["env"] = [{"name": "A"}]
    proc = apply(control_plane, namespace, bad)
    assert proc.returncode != 0 and crds.ENV_ONE_SOURCE in proc.stderr


def test_entrypoint_workflow_with_free_json_is_accepted(control_plane: ControlPlane, namespace: str) -> None:
    manifest = with_spec(
        "coded", toolCalls=None, snapshotEveryNCalls=None, entrypoint="examples.flows.hello:main",
        input={"n": 3, "nested": {"list": [1, "two", None]}}, signals={"approve": {"by": "me"}, "n": 5},
    )  # fmt: skip
    proc = apply(control_plane, namespace, manifest)
    assert proc.returncode == 0, proc.stderr
    got = control_plane.kubectl_json("get", "dwf", "coded", "-n", namespace)
    # Free JSON is kept as written (not pruned).
    assert got["spec"]["input"] == manifest["spec"]["input"]
    assert got["spec"]["signals"] == manifest["spec"]["signals"]


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "unknown tool type": (
        with_call("bad-type", {"type": "exec", "command": "ls"}),
        'Unsupported value: "exec": supported values: "shell", "write_file", "read_file"',
    ),
    "shell without command": (with_call("no-command", {"type": "shell"}), "a shell call requires command"),
    "write_file without contents": (
        with_call("no-contents", {"type": "write_file", "path": "a.txt"}),
        "a write_file call requires path and contents",
    ),
    "read_file without path": (with_call("no-path", {"type": "read_file"}), "a read_file call requires path"),
    "field of another call type": (
        with_call("stray", {"type": "read_file", "path": "a", "command": "ls"}),
        "command, timeout, cwd and env apply only to shell calls",
    ),
    "absolute path": (
        with_call("abs", {"type": "read_file", "path": "/etc/passwd"}),
        "path must be relative to the workspace, not absolute",
    ),
    "'..' path": (
        with_call("dotdot", {"type": "read_file", "path": "notes/../../etc/passwd"}),
        "path must not contain '..' segments",
    ),
    "'..' cwd": (
        with_call("dotdot-cwd", {"type": "shell", "command": "ls", "cwd": ".."}),
        "cwd must not contain '..' segments",
    ),
    "workspace itself": (
        with_call("dot", {"type": "write_file", "path": "./.", "contents": "x"}),
        "path must name something inside the workspace, not the workspace itself",
    ),
    "reserved operation id": (
        with_call("reserved", {"type": "shell", "command": "ls", "operationId": "snapshot/1"}),
        crds.RESERVED_OPERATION_ID,
    ),
    "both toolCalls and entrypoint": (
        with_spec("both", entrypoint="examples.flows.hello:main"),
        crds.ONE_PROGRAM,
    ),
    "neither toolCalls nor entrypoint": (with_spec("neither", toolCalls=None), crds.ONE_PROGRAM),
    "sandbox and sandboxRef": (with_spec("two-sandboxes", sandboxRef={"name": "shared"}), crds.ONE_SANDBOX),
    "bad entrypoint": (
        with_spec("bad-entry", toolCalls=None, entrypoint="not a reference"),
        "spec.entrypoint in body should match",
    ),
    "negative snapshotEveryNCalls": (
        with_spec("negative", snapshotEveryNCalls=-1),
        "spec.snapshotEveryNCalls in body should be greater than or equal to 0",
    ),
    "snapshotEveryNCalls too large": (
        with_spec("huge", snapshotEveryNCalls=10_001),
        "spec.snapshotEveryNCalls in body should be less than or equal to 10000",
    ),
    "unknown field": (with_spec("unknown", retrys={"maxAttempts": 2}), 'unknown field "spec.retrys"'),
    "loss after more calls than there are": (with_spec("loss", injectLossAfterNCalls=10_000), crds.LOSS_WITHIN_CALLS),
    "timeout: true": (
        with_call("bool-timeout", {"type": "shell", "command": "ls", "timeout": True}),
        "must be of type number",
    ),
    "onTimeout on a file call": (
        with_call("file-timeout", {"type": "read_file", "path": "a", "failurePolicy": {"onTimeout": "fail"}}),
        crds.TIMEOUT_POLICY_SHELL_ONLY,
    ),
    "unknown failurePolicy value": (
        with_spec("bad-policy", failurePolicy={"onNonZeroExit": "abort"}),
        'Unsupported value: "abort": supported values: "continue", "fail"',
    ),
    "NUL in an env value": (
        with_call("nul-env", {"type": "shell", "command": "ls", "env": {"A": "x\u0000y"}}),
        "in body should match",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_manifest_is_rejected_with_the_rule_message(
    control_plane: ControlPlane, namespace: str, case: str
) -> None:
    manifest, message = INVALID[case]
    proc = apply(control_plane, namespace, manifest)
    assert proc.returncode != 0, f"{case}: accepted\n{proc.stdout}"
    assert message in proc.stderr, proc.stderr
    name = manifest["metadata"]["name"]
    assert control_plane.kubectl("get", "dwf", name, "-n", namespace, check=False).returncode != 0


def test_unknown_field_is_pruned_without_strict_validation(
    control_plane: ControlPlane, namespace: str
) -> None:
    # The structural schema prunes what it does not declare; --validate=strict (kubectl's default) rejects it instead.
    manifest = with_spec("pruned", retrys={"maxAttempts": 2})
    proc = apply(control_plane, namespace, manifest, "--validate=false")
    assert proc.returncode == 0, proc.stderr
    assert "retrys" not in control_plane.kubectl_json("get", "dwf", "pruned", "-n", namespace)["spec"]


def test_cancel_cannot_go_back_to_false(control_plane: ControlPlane, namespace: str) -> None:
    assert apply(control_plane, namespace, with_spec("cancelled")).returncode == 0
    patch = ["patch", "dwf", "cancelled", "-n", namespace, "--type=merge", "-p"]
    control_plane.kubectl(*patch, '{"spec":{"cancel":false}}')  # false -> false is fine
    control_plane.kubectl(*patch, '{"spec":{"cancel":true}}')
    for undo in ('{"spec":{"cancel":false}}', '{"spec":{"cancel":null}}'):
        proc = control_plane.kubectl(*patch, undo, check=False)
        assert proc.returncode != 0, undo
        assert crds.CANCEL_FINAL in proc.stderr
    proc = apply(control_plane, namespace, with_spec("cancelled", cancel=False))
    assert proc.returncode != 0 and crds.CANCEL_FINAL in proc.stderr
    assert control_plane.kubectl_json("get", "dwf", "cancelled", "-n", namespace)["spec"]["cancel"] is True


def test_status_is_written_only_through_the_status_subresource(
    control_plane: ControlPlane, namespace: str
) -> None:
    assert apply(control_plane, namespace, with_spec("statused")).returncode == 0
    condition = {"type": "Ready", "status": "True", "reason": "Provisioned", "message": "",
                 "lastTransitionTime": "2025-01-01T00:00:00Z"}  # fmt: skip
    status = {"phase": "Running", "runId": "r1", "conditions": [condition], "result": {"free": ["json", 1]}}
    control_plane.kubectl(
        "patch", "dwf", "statused", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    control_plane.kubectl(
        "patch", "dwf", "statused", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"suspend": True}, "status": {"phase": "Tampered"}}),
    )  # fmt: skip
    got = control_plane.kubectl_json("get", "dwf", "statused", "-n", namespace)
    assert got["status"] == status
    assert got["spec"]["suspend"] is True

    # The status schema is enforced too.
    proc = control_plane.kubectl(
        "patch", "dwf", "statused", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}}), check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and 'Unsupported value: "Maybe"' in proc.stderr


def doc_commands() -> list[str]:
    """The shell commands of docs/kubernetes.md's "Custom resources" section, in order."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    section = text.split("## Custom resources", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```sh\n")[1:]
    return [line for block in blocks for line in block.split("```", 1)[0].splitlines() if line.strip()]


def test_docs_commands_work(control_plane: ControlPlane, installed: None, tmp_path: Path) -> None:
    commands = doc_commands()
    assert any(c.startswith("kubectl apply -f crds/") for c in commands)
    # The fixture has set KUBECONFIG, so plain kubectl (and the docs' relative paths, from the root) work.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    try:
        for command in commands:
            argv = shlex.split(command)
            if argv[0] == "python":
                argv[0] = sys.executable
                if argv[-2] == "--write":
                    argv[-1] = str(tmp_path)  # the committed files stay as they are
            elif argv[0] != "kubectl":
                raise AssertionError(f"unexpected command in docs/kubernetes.md: {command}")
            proc = subprocess.run(
                argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
            )
            assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
            outputs.append(proc.stdout)
        assert outputs[commands.index("kubectl get dwf")].split()[:5] == [
            "NAME",
            "PHASE",
            "CALLS",
            "SNAPSHOT",
            "AGE",
        ]
        listed = control_plane.kubectl("get", "durable-sandbox", "-o", "name").stdout.split()
        assert "workflow.durable-sandbox.dev/hello" in listed
    finally:
        control_plane.kubectl("delete", "-f", str(HELLO), "--ignore-not-found")
