"""The committed CRDs at a real API server: installed with kubectl, the example manifest is accepted, and every
admission rule rejects a bad manifest at `kubectl apply` with its message."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from durable_sandbox.kube.spec import crds
from tests.e2e.controlplane import fresh_namespace
from tests.e2e.operator_support import wait_established

if TYPE_CHECKING:
    from .controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
HELLO = ROOT / "examples" / "hello-workflow.yaml"
CRD_NAMES = ["workflows.durable-sandbox.dev", "sandboxes.durable-sandbox.dev"]


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> None:
    # The committed files, exactly as docs/kubernetes.md installs them.
    control_plane.kubectl("apply", "-f", str(CRD_DIR))
    wait_established(control_plane, CRD_NAMES)


@pytest.fixture
def namespace(control_plane: ControlPlane, installed: None) -> Iterator[str]:
    with fresh_namespace(control_plane, "crds") as name:
        yield name


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
        "-p", json.dumps({"status": {"phase": "Ready", "provider": "e2b", "providerId": "p-1", "state": "Idle",
                                     "stateSince": "2026-01-01T00:00:00Z",
                                     "handle": {"runtimeClassName": "gvisor"}}}),
    )  # fmt: skip
    table = control_plane.kubectl("get", "dsbx", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PROVIDER", "READY", "STATE", "SINCE", "AGE"]
    # The provider shown is the one the operator pinned (status.provider; its default when the spec names none).
    assert table[1].split()[:3] == ["shared", "Ready", "e2b"]
    # The idle state (issue 27) and since when, as an age (READY is empty here: no conditions were patched in).
    assert table[1].split()[3] == "Idle", table
    # The RuntimeClass the sandbox runs under: in -o wide only.
    wide = control_plane.kubectl("get", "dsbx", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-2] == "RUNTIME" and wide[1].split()[-2] == "gvisor", wide  # READY is empty here

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
        f"in body should match '{crds.PATH_RELATIVE}'",
    ),
    "absolute path in the third call": (
        with_spec("abs-third", toolCalls=[{"type": "shell", "command": "ls"}, {"type": "read_file", "path": "a"},
                                          {"type": "read_file", "path": "/etc/passwd"}]),
        f"in body should match '{crds.PATH_RELATIVE}'",
    ),
    "'..' path": (
        with_call("dotdot", {"type": "read_file", "path": "notes/../../etc/passwd"}),
        f"in body should match '{crds.PATH_NO_DOTDOT}'",
    ),
    "'..' cwd": (
        with_call("dotdot-cwd", {"type": "shell", "command": "ls", "cwd": ".."}),
        f"in body should match '{crds.PATH_NO_DOTDOT}'",
    ),
    "workspace itself": (
        with_call("dot", {"type": "write_file", "path": "./.", "contents": "x"}),
        f"in body should match '{crds.PATH_NAMES_SOMETHING}'",
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


# Where the API server reports each rejection: the field, and the rule's message after it.
FIELD_OF = {
    "unknown tool type": "spec.toolCalls[0].type",
    "shell without command": "spec.toolCalls[0]",
    "write_file without contents": "spec.toolCalls[0]",
    "read_file without path": "spec.toolCalls[0]",
    "field of another call type": "spec.toolCalls[0]",
    "absolute path": "spec.toolCalls[0].path",
    "absolute path in the third call": "spec.toolCalls[2].path",
    "'..' path": "spec.toolCalls[0].path",
    "'..' cwd": "spec.toolCalls[0].cwd",
    "workspace itself": "spec.toolCalls[0].path",
    "reserved operation id": "spec.toolCalls[0].operationId",
    "both toolCalls and entrypoint": "spec",
    "neither toolCalls nor entrypoint": "spec",
    "sandbox and sandboxRef": "spec",
    "bad entrypoint": "spec.entrypoint",
    "negative snapshotEveryNCalls": "spec.snapshotEveryNCalls",
    "snapshotEveryNCalls too large": "spec.snapshotEveryNCalls",
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_manifest_is_rejected_with_the_rule_message(
    control_plane: ControlPlane, namespace: str, case: str
) -> None:
    manifest, message = INVALID[case]
    proc = apply(control_plane, namespace, manifest)
    assert proc.returncode != 0, f"{case}: accepted\n{proc.stdout}"
    assert message in proc.stderr, proc.stderr
    if case in FIELD_OF:  # the field, then the rule: `spec.toolCalls[0].path: Invalid value: "/etc/passwd": path must ...`
        assert f"{FIELD_OF[case]}: " in proc.stderr.split(message)[0], proc.stderr
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


# ------------------------------------------------------------------------------------------- as users meet it

# The object fields of the schema, as kubectl explain paths: explaining each lists its fields with their descriptions.
EXPLAINED = [
    "workflow", "workflow.spec", "workflow.spec.toolCalls", "workflow.spec.sandbox", "workflow.spec.sandbox.env",
    "workflow.spec.sandbox.env.valueFrom.secretKeyRef", "workflow.spec.retry", "workflow.spec.sandboxRef",
    "workflow.status", "workflow.status.conditions", "workflow.status.calls", "workflow.status.currentCall",
    "workflow.status.error", "workflow.status.journal", "workflow.status.recentOperations", "workflow.status.sandbox",
    "workflow.status.pendingCallbacks", "sandbox.spec", "sandbox.status",
]  # fmt: skip


def schema_at(kind: str, path: list[str]) -> dict[str, Any]:
    crd = next(c for c in crds.generate_crds() if c["spec"]["names"]["singular"] == kind)
    node: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in path:
        node = node["properties"][part]
        node = node.get("items", node)
    return node


@pytest.mark.parametrize("path", EXPLAINED)
def test_kubectl_explain_describes_every_field(control_plane: ControlPlane, installed: None, path: str) -> None:
    out = control_plane.kubectl("explain", path).stdout
    assert "<no description>" not in out, out
    kind, *parts = path.split(".")
    node = schema_at(kind, parts)
    # Every field is listed with (the start of) its description; kubectl wraps long lines, so compare words.
    words = " ".join(out.split())
    for name, prop in node["properties"].items():
        assert f"{name}\t" in out or f"{name} " in out or f"{name}\n" in out, f"{path}.{name} not listed:\n{out}"
        if name == "metadata":  # the API server documents it (ObjectMeta); a CRD may not
            assert "Standard object's metadata" in words, out
            continue
        first = " ".join(prop["description"].split()[:6])
        assert first in words, f"{path}.{name}: {first!r} not in\n{out}"


def test_defaults_are_applied_so_the_stored_spec_is_the_effective_one(
    control_plane: ControlPlane, namespace: str
) -> None:
    manifest = with_spec("defaults", snapshotEveryNCalls=None, retry={}, sandbox={"env": []})
    assert apply(control_plane, namespace, manifest, "--server-side").returncode == 0
    spec = yaml.safe_load(control_plane.kubectl("get", "dwf", "defaults", "-n", namespace, "-o", "yaml").stdout)["spec"]
    assert (spec["snapshotEveryNCalls"], spec["retainLatestSnapshot"], spec["suspend"], spec["cancel"]) == (
        0, False, False, False,
    )  # fmt: skip
    assert spec["sandbox"]["leaseSeconds"] == 3600
    assert "provider" not in spec["sandbox"], "no provider default: the operator's --default-provider decides it"
    assert spec["retry"] == {"maxAttempts": 3, "initialIntervalSeconds": 1, "backoff": 2, "maxIntervalSeconds": 60}
    # What has no default stays absent: absent means "not set" (no timeout, no TTL).
    assert "timeoutSeconds" not in spec and "ttlSecondsAfterFinished" not in spec and "sandboxRef" not in spec
    # The models read the stored spec the same way as the manifest.
    from durable_sandbox.kube.spec.models import WorkflowSpec

    assert WorkflowSpec.model_validate(spec) == WorkflowSpec.model_validate(manifest["spec"] | {"retry": {}})


@pytest.fixture(scope="module")
def policy_active(control_plane: ControlPlane, installed: None) -> None:
    """The admission policy (installed with the CRDs) is enforced once the API server has loaded it: a probe
    update that breaks it is refused. Nothing else signals that the policy is live."""
    name = f"probe-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    try:
        control_plane.apply(with_spec("probe", signals={"a": 1}), "-n", name)

        def refused() -> bool:
            proc = control_plane.kubectl(
                "patch", "dwf", "probe", "-n", name, "--type=merge", "--dry-run=server",
                "-p", '{"spec":{"signals":{"a":2}}}', check=False,
            )  # fmt: skip
            return proc.returncode != 0 and crds.SIGNALS_ONLY_GAIN in proc.stderr

        control_plane.wait_until(refused, 60, "the Workflow admission policy to take effect")
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false")


def coded(name: str, **changes: Any) -> dict[str, Any]:
    return with_spec(
        name, toolCalls=None, snapshotEveryNCalls=None, entrypoint="examples.flows.hello_flow:hello", **changes
    )


# (field, the manifest, the spec changes that make it change): changed, removed, added. Each is refused on
# update, by kubectl apply and by kubectl patch, and the stored spec keeps the original.
PROGRAM_CHANGES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "toolCalls changed": ("toolCalls", with_spec("p"), {"toolCalls": [{"type": "shell", "command": "echo other"}]}),
    "toolCalls replaced by an entrypoint": (
        "toolCalls", with_spec("p"), {"toolCalls": None, "entrypoint": "examples.flows.hello_flow:hello"},
    ),
    "entrypoint changed": ("entrypoint", coded("p"), {"entrypoint": "examples.flows.hello_flow:greeting"}),
    "input changed": ("input", coded("p", input={"n": 1}), {"input": {"n": 2}}),
    "input removed": ("input", coded("p", input={"n": 1}), {"input": None}),
    "input added": ("input", coded("p"), {"input": [1]}),
    "sandbox changed": ("sandbox", with_spec("p"), {"sandbox": {"provider": "e2b"}}),
    "sandbox added": ("sandbox", with_spec("p", sandbox=None), {"sandbox": {"provider": "local"}}),
    "sandbox removed": ("sandbox", with_spec("p"), {"sandbox": None}),
    "sandboxRef changed": ("sandboxRef", with_spec("p", sandbox=None, sandboxRef={"name": "a"}), {"sandboxRef": {"name": "b"}}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(PROGRAM_CHANGES))
def test_the_program_cannot_change_after_creation(
    control_plane: ControlPlane, namespace: str, policy_active: None, case: str
) -> None:
    field, manifest, changes = PROGRAM_CHANGES[case]
    assert apply(control_plane, namespace, manifest).returncode == 0
    changed = copy.deepcopy(manifest)
    for key, value in changes.items():
        if value is None:
            changed["spec"].pop(key)
        else:
            changed["spec"][key] = value
    message = crds.immutable_message(field)
    before = control_plane.kubectl_json("get", "dwf", "p", "-n", namespace)["spec"]
    patch = json.dumps({"spec": changes})  # a null removes the field (JSON merge patch)
    for proc in (
        apply(control_plane, namespace, changed),
        control_plane.kubectl("patch", "dwf", "p", "-n", namespace, "--type=merge", "-p", patch, check=False),
    ):
        assert proc.returncode != 0, f"{case}: accepted\n{' '.join(proc.args[2:])}"
        assert message in proc.stderr, proc.stderr
        if field == "input" or (field in crds.POLICY_COMPARED and changes.get(field) is not None):
            # A changed value refused by the admission policy: its message names the field.
            assert "denied request: " + message in proc.stderr, proc.stderr
        else:  # CRD rules report the field
            assert f"spec.{field}: Invalid value" in proc.stderr, proc.stderr
    assert control_plane.kubectl_json("get", "dwf", "p", "-n", namespace)["spec"] == before
    # Creating a Workflow with the changed program is fine: the rules are about change only.
    changed["metadata"]["name"] = "p-2"
    assert apply(control_plane, namespace, changed).returncode == 0


def test_a_replay_callback_is_answered_rerun_or_skip(control_plane: ControlPlane, namespace: str,
                                                    policy_active: None) -> None:
    assert apply(control_plane, namespace, coded("asked")).returncode == 0
    patch = ["patch", "dwf", "asked", "-n", namespace, "--type=merge", "-p"]
    for refused in ('"yes"', '{"answer":"rerun"}', '["skip"]', "1", "true"):
        proc = control_plane.kubectl(*patch, f'{{"spec":{{"signals":{{"replay:sandbox/push":{refused}}}}}}}', check=False)
        assert proc.returncode != 0 and "denied request: " + crds.REPLAY_ANSWERS in proc.stderr, (refused, proc.stderr)
    control_plane.kubectl(*patch, '{"spec":{"signals":{"replay:sandbox/push":"skip"}}}')
    control_plane.kubectl(*patch, '{"spec":{"signals":{"replay:sandbox/notify":"rerun","other":"yes"}}}')
    signals = control_plane.kubectl_json("get", "dwf", "asked", "-n", namespace)["spec"]["signals"]
    assert signals == {"replay:sandbox/push": "skip", "replay:sandbox/notify": "rerun", "other": "yes"}
    # Created with a wrong answer (the operator refuses that signal): later updates are not held up by it.
    assert apply(control_plane, namespace, coded("asked-wrong", signals={"replay:sandbox/push": "yes"})).returncode == 0
    control_plane.kubectl("patch", "dwf", "asked-wrong", "-n", namespace, "--type=merge", "-p", '{"spec":{"cancel":true}}')


def test_signals_can_only_gain_keys(control_plane: ControlPlane, namespace: str, policy_active: None) -> None:
    assert apply(control_plane, namespace, coded("signalled")).returncode == 0
    patch = ["patch", "dwf", "signalled", "-n", namespace, "--type=merge", "-p"]
    control_plane.kubectl(*patch, '{"spec":{"signals":{"approve":{"by":"ann","ok":true}}}}')
    control_plane.kubectl(*patch, '{"spec":{"signals":{"second":[1,2]}}}')
    control_plane.kubectl(*patch, '{"spec":{"signals":{"approve":{"by":"ann","ok":true}}}}')  # the same again
    for refused in (
        '{"spec":{"signals":{"approve":{"by":"bob","ok":true}}}}',  # a value changed
        '{"spec":{"signals":{"second":null}}}',  # a key removed
        '{"spec":{"signals":null}}',  # all removed
    ):
        proc = control_plane.kubectl(*patch, refused, check=False)
        assert proc.returncode != 0 and crds.SIGNALS_ONLY_GAIN in proc.stderr, (refused, proc.stderr)
    signals = control_plane.kubectl_json("get", "dwf", "signalled", "-n", namespace)["spec"]["signals"]
    assert signals == {"approve": {"by": "ann", "ok": True}, "second": [1, 2]}
    # Steering fields stay free: suspend both ways, cancel to true; status writes are not subject to the policy.
    control_plane.kubectl(*patch, '{"spec":{"suspend":true}}')
    control_plane.kubectl(*patch, '{"spec":{"suspend":false,"cancel":true}}')
    control_plane.kubectl(
        "patch", "dwf", "signalled", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", '{"status":{"phase":"Cancelled","kopf":{"progress":{"h":{"retries":1}}}}}',
    )  # fmt: skip
    got = control_plane.kubectl_json("get", "dwf", "signalled", "-n", namespace)
    assert got["status"]["kopf"] == {"progress": {"h": {"retries": 1}}}


def test_anchors_and_aliases_are_accepted_by_both(control_plane: ControlPlane, namespace: str) -> None:
    """Anchors and aliases that expand moderately: `dsb run`'s bounded loader accepts what kubectl accepts."""
    from durable_sandbox.kube.spec.manifests import load_manifests

    anchored = (
        "apiVersion: durable-sandbox.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: anchored\nspec:\n"
        "  toolCalls:\n    - &ls {type: shell, command: ls}\n    - *ls\n"
        "  signals:\n    base: &base {by: ops}\n    again: *base\n"
    )
    (wf,) = load_manifests(anchored)
    proc = control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=anchored, check=False)
    assert proc.returncode == 0, proc.stderr
    got = control_plane.kubectl_json("get", "dwf", "anchored", "-n", namespace)
    assert got["spec"]["signals"] == {"base": {"by": "ops"}, "again": {"by": "ops"}}
    assert len(got["spec"]["toolCalls"]) == len(wf.spec.tool_calls or []) == 2


def test_a_fork_is_admitted_only_for_who_may_get_its_source(control_plane: ControlPlane, namespace: str) -> None:
    """Issue 36, trust: the fork admission policy (crds/forks.durable-sandbox.dev.policy.yaml) asks the authorizer
    whether the creator may get the source. A ServiceAccount that may create Sandboxes and Workflows but not get
    the sources is refused (Sandbox spec.from.sandbox, spec.from.workflow, Workflow spec.forkOf), with the RBAC it
    needs; once granted get on them by name, the same requests are admitted."""
    assert apply(control_plane, namespace, {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox",
                                            "metadata": {"name": "src"}, "spec": {"provider": "local"}}).returncode == 0
    assert apply(control_plane, namespace, with_spec("wsrc")).returncode == 0
    control_plane.kubectl("create", "serviceaccount", "forker", "-n", namespace)
    control_plane.kubectl("create", "role", "fork-maker", "-n", namespace, "--verb=create",
                          "--resource=sandboxes.durable-sandbox.dev,workflows.durable-sandbox.dev")
    user = f"system:serviceaccount:{namespace}:forker"
    control_plane.kubectl("create", "rolebinding", "fork-maker", "-n", namespace, "--role=fork-maker",
                          f"--serviceaccount={namespace}:forker")
    forks = {
        crds.fork_refused_message("from.sandbox", "sandboxes"): {
            "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "fork-a"},
            "spec": {"provider": "local", "from": {"sandbox": "src", "afterCall": 1}}},
        crds.fork_refused_message("from.workflow", "workflows"): {
            "apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "fork-b"},
            "spec": {"provider": "local", "from": {"workflow": "wsrc", "afterCall": 1}}},
        crds.fork_refused_message("forkOf.workflow", "workflows"): with_spec(
            "fork-c", forkOf={"workflow": "wsrc", "afterCall": 1}),
    }  # fmt: skip

    def create(manifest: dict[str, Any]) -> Any:  # create only (apply would need get on the fork too)
        return control_plane.kubectl("create", "-n", namespace, "--dry-run=server", "-f", "-", as_user=user,
                                     input=json.dumps(manifest), check=False)

    def refused_with(message: str, manifest: dict[str, Any]) -> Callable[[], bool]:
        def check() -> bool:
            proc = create(manifest)
            return proc.returncode != 0 and message in proc.stderr
        return check

    def admitted(manifest: dict[str, Any]) -> Callable[[], bool]:
        return lambda: create(manifest).returncode == 0

    for message, manifest in forks.items():  # the policy takes effect asynchronously after it is installed
        control_plane.wait_until(refused_with(message, manifest), 60,
                                 f"the fork admission policy to refuse {manifest['metadata']['name']}")
    control_plane.kubectl("create", "role", "read-sources", "-n", namespace, "--verb=get",
                          "--resource=sandboxes.durable-sandbox.dev", "--resource-name=src")
    control_plane.kubectl("create", "rolebinding", "read-sources", "-n", namespace, "--role=read-sources",
                          f"--serviceaccount={namespace}:forker")
    refused = {m: create(f) for m, f in forks.items()}
    # Get on the Sandbox src only: the Sandbox fork of it is admitted, those of Workflow wsrc still refused.
    sandbox_fork = crds.fork_refused_message("from.sandbox", "sandboxes")
    control_plane.wait_until(admitted(forks[sandbox_fork]), 30, "get on src to admit its fork")
    for message, proc in refused.items():
        if message != sandbox_fork:
            assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    control_plane.kubectl("create", "role", "read-wf", "-n", namespace, "--verb=get",
                          "--resource=workflows.durable-sandbox.dev", "--resource-name=wsrc")
    control_plane.kubectl("create", "rolebinding", "read-wf", "-n", namespace, "--role=read-wf",
                          f"--serviceaccount={namespace}:forker")
    for manifest in forks.values():
        control_plane.wait_until(admitted(manifest), 30, f"get on the source to admit {manifest['metadata']['name']}")
