"""Smoke tests of the e2e harness itself: the API machinery the operator relies on, through the real kubectl.

If one of these fails, operator e2e failures are about the harness, not the operator.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.controlplane import fresh_namespace

if TYPE_CHECKING:
    # Only for annotations: conftest modules are not meant to be imported at run time.
    from .controlplane import ControlPlane

pytestmark = pytest.mark.e2e

GROUP = "smoke.durable-sandbox.test"
CRD_NAME = f"widgets.{GROUP}"
API_VERSION = f"{GROUP}/v1"
CEL_MESSAGE = "spec.size must be at most 10"

# Once the garbage collector acts on widgets at all (gc_knows_widgets), it removes a dependent within seconds.
GC_TIMEOUT = "60s"

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer"}, "owner": {"type": "string"}},
                                "x-kubernetes-validations": [
                                    {"rule": "self.size <= 10", "message": CEL_MESSAGE}
                                ],
                            },
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}, "ready": {"type": "integer"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, size: int = 1, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Widget",
        "metadata": {"name": name, **metadata},
        "spec": {"size": size},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> str:
    # Installed once, early in the module, so the garbage collector's discovery has caught up by the GC test.
    control_plane.apply(WIDGET_CRD)
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    return CRD_NAME


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(control_plane, "smoke") as name:
        yield name


def test_server_reports_the_pinned_release(control_plane: ControlPlane) -> None:
    version = control_plane.kubectl_json("version")
    assert version["serverVersion"]["gitVersion"] == control_plane.version
    major, minor = control_plane.version.removeprefix("v").split(".")[:2]
    assert (version["serverVersion"]["major"], version["serverVersion"]["minor"]) == (major, minor)


def test_cel_rule_rejects_invalid_object(control_plane: ControlPlane, crd: str, namespace: str) -> None:
    proc = control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(widget("too-big", size=11)), check=False
    )
    assert proc.returncode != 0
    assert CEL_MESSAGE in proc.stderr
    assert control_plane.kubectl("get", "widget", "too-big", "-n", namespace, check=False).returncode != 0


def test_status_subresource_and_printer_columns(
    control_plane: ControlPlane, crd: str, namespace: str
) -> None:
    control_plane.apply(widget("w1", size=7), "-n", namespace)
    control_plane.kubectl(
        "patch", "widget", "w1", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Ready", "ready": 3}}),
    )  # fmt: skip
    # Through the main resource the status stanza is ignored: that is what the status subresource guarantees.
    control_plane.kubectl(
        "patch", "widget", "w1", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"size": 8}, "status": {"phase": "Tampered"}}),
    )  # fmt: skip
    obj = control_plane.kubectl_json("get", "widget", "w1", "-n", namespace)
    assert obj["status"] == {"phase": "Ready", "ready": 3}
    assert obj["spec"]["size"] == 8

    table = control_plane.kubectl("get", "widgets", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "PHASE", "AGE"]
    assert table[1].split()[:3] == ["w1", "8", "Ready"]


def test_finalizer_blocks_deletion_until_removed(
    control_plane: ControlPlane, crd: str, namespace: str
) -> None:
    control_plane.apply(widget("held", finalizers=[f"{GROUP}/hold"]), "-n", namespace)
    control_plane.kubectl("delete", "widget", "held", "-n", namespace, "--wait=false")

    # Without finalizers a custom resource is gone when DELETE returns; still being there is the finalizer's doing.
    obj = control_plane.kubectl_json("get", "widget", "held", "-n", namespace)
    assert obj["metadata"].get("deletionTimestamp"), "deletion should be pending"

    control_plane.kubectl(
        "patch", "widget", "held", "-n", namespace, "--type=json",
        "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]),
    )  # fmt: skip
    control_plane.kubectl("wait", "--for=delete", "widget/held", "-n", namespace, "--timeout=30s")


def test_deleting_a_namespace_removes_its_contents(control_plane: ControlPlane, crd: str) -> None:
    ns = unique("doomed")
    control_plane.kubectl("create", "namespace", ns)
    control_plane.kubectl("create", "configmap", "c", "-n", ns, "--from-literal=k=v")
    control_plane.apply(widget("w"), "-n", ns)

    control_plane.kubectl("delete", "namespace", ns, "--wait=false")
    control_plane.kubectl("wait", "--for=delete", f"namespace/{ns}", "--timeout=120s")
    for kind in ("configmaps", "widgets"):
        listed = control_plane.kubectl_json("get", kind, "-n", ns)
        assert listed["items"] == []


class WatchStream:
    """``kubectl get -w --output-watch-events -o json`` as a queue of events, read on a thread."""

    def __init__(self, control_plane: ControlPlane, *args: str) -> None:
        self.proc = subprocess.Popen(
            [control_plane.kubectl_bin, f"--kubeconfig={control_plane.kubeconfig}", "get", *args,
             "--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        # kubectl prints each event as indented JSON; decode documents as soon as they are complete.
        assert self.proc.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self.proc.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                continue
            buffer = buffer.lstrip()[end:]
            self.events.put(event)
        self.events.put(None)

    def next(self, timeout: float = 30) -> dict[str, Any]:
        event = self.events.get(timeout=timeout)
        if event is None:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"watch ended early: {stderr}")
        return event

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def test_watch_sees_added_modified_deleted(control_plane: ControlPlane, crd: str, namespace: str) -> None:
    control_plane.apply(widget("watched", size=1), "-n", namespace)
    watch = WatchStream(control_plane, "widgets", "-n", namespace)
    try:
        # The initial list arrives as ADDED; once it has, the watch is established and later changes are seen.
        first = watch.next()
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "watched")

        control_plane.kubectl(
            "patch", "widget", "watched", "-n", namespace, "--type=merge", "-p", '{"spec":{"size":2}}'
        )
        modified = watch.next()
        assert modified["type"] == "MODIFIED"
        assert modified["object"]["spec"]["size"] == 2

        control_plane.apply(widget("second"), "-n", namespace)
        added = watch.next()
        assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "second")

        control_plane.kubectl("delete", "widget", "watched", "-n", namespace)
        deleted = watch.next()
        assert (deleted["type"], deleted["object"]["metadata"]["name"]) == ("DELETED", "watched")
    finally:
        watch.close()


def test_update_with_stale_resource_version_conflicts(
    control_plane: ControlPlane, crd: str, namespace: str
) -> None:
    control_plane.apply(widget("contended", size=1), "-n", namespace)
    stale = control_plane.kubectl_json("get", "widget", "contended", "-n", namespace)
    control_plane.kubectl(
        "patch", "widget", "contended", "-n", namespace, "--type=merge", "-p", '{"spec":{"size":2}}'
    )

    stale["spec"]["size"] = 3
    proc = control_plane.kubectl("replace", "-f", "-", input=json.dumps(stale), check=False)
    assert proc.returncode != 0
    # "Conflict" is the reason kubectl prints for HTTP 409.
    assert "Error from server (Conflict)" in proc.stderr
    assert "the object has been modified" in proc.stderr
    assert control_plane.kubectl_json("get", "widget", "contended", "-n", namespace)["spec"]["size"] == 2


def test_impersonation_and_rbac(control_plane: ControlPlane, namespace: str) -> None:
    sa = f"system:serviceaccount:{namespace}:reader"
    control_plane.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    control_plane.kubectl("create", "configmap", "visible", "-n", namespace, "--from-literal=k=v")

    whoami = control_plane.kubectl_json("auth", "whoami", as_user=sa)
    assert whoami["status"]["userInfo"]["username"] == sa

    def can(verb: str, resource: str, ns: str = namespace) -> bool:
        proc = control_plane.kubectl("auth", "can-i", verb, resource, "-n", ns, as_user=sa, check=False)
        return proc.stdout.strip() == "yes"

    denied = control_plane.kubectl("get", "configmaps", "-n", namespace, as_user=sa, check=False)
    assert denied.returncode != 0
    assert "is forbidden" in denied.stderr

    control_plane.kubectl(
        "create",
        "role",
        "configmap-reader",
        "-n",
        namespace,
        "--verb=get,list,watch",
        "--resource=configmaps",
    )
    control_plane.kubectl(
        "create", "rolebinding", "reader", "-n", namespace, "--role=configmap-reader",
        f"--serviceaccount={namespace}:reader",
    )  # fmt: skip
    # The authorizer reads RBAC objects from an informer cache, so a new binding takes effect shortly after.
    control_plane.wait_until(lambda: can("list", "configmaps"), 30, "the RoleBinding to take effect")

    listed = control_plane.kubectl("get", "configmaps", "-n", namespace, "-o", "name", as_user=sa)
    assert "configmap/visible" in listed.stdout.split()
    for verb, resource, ns in [
        ("create", "configmaps", namespace),
        ("delete", "configmaps", namespace),
        ("list", "secrets", namespace),
        ("list", "configmaps", "default"),
    ]:
        assert not can(verb, resource, ns), f"{verb} {resource} in {ns} should be denied"
    created = control_plane.kubectl("create", "configmap", "sneaky", "-n", namespace, as_user=sa, check=False)
    assert created.returncode != 0
    assert "is forbidden" in created.stderr


def helm_env(tmp_path: Path) -> dict[str, str]:
    # Private helm state: nothing read from or written to the developer's ~/.config/helm or ~/.cache/helm.
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
        "HELM_DATA_HOME": str(tmp_path / "helm-data"),
    }


def write_chart(root: Path, kube_version: str) -> Path:
    chart = root / "trivial"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        f'apiVersion: v2\nname: trivial\nversion: 0.1.0\nkubeVersion: "{kube_version}"\n'
    )
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
        "  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    return chart


def run_helm(helm: Path, tmp_path: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, env=helm_env(tmp_path), timeout=120, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_helm_version_and_template(helm: Path, tmp_path: Path) -> None:
    version = run_helm(helm, tmp_path, "version", "--template", "{{.Version}}").stdout.strip()
    assert version.startswith("v") and version.count(".") == 2, version
    chart = write_chart(tmp_path, ">=1.20.0-0")
    rendered = run_helm(helm, tmp_path, "template", "demo", str(chart), "--set", "greeting=hi").stdout
    assert "name: demo-greeting" in rendered
    assert 'greeting: "hi"' in rendered


def test_helm_reads_the_server_version(control_plane: ControlPlane, helm: Path, tmp_path: Path) -> None:
    # --validate makes helm ask the cluster for its capabilities, so kubeVersion is checked against /version.
    ok = write_chart(tmp_path / "ok", f">={control_plane.version.removeprefix('v')}-0")
    rendered = run_helm(helm, tmp_path, "template", "demo", str(ok), "--validate").stdout
    assert f'kubeVersion: "{control_plane.version}"' in rendered

    too_new = write_chart(tmp_path / "too-new", "<1.20.0-0")
    proc = run_helm(helm, tmp_path, "template", "demo", str(too_new), "--validate", check=False)
    assert proc.returncode != 0
    assert f"incompatible with Kubernetes {control_plane.version}" in proc.stderr


def test_helm_install_and_uninstall(
    control_plane: ControlPlane, helm: Path, tmp_path: Path, namespace: str
) -> None:
    chart = write_chart(tmp_path, ">=1.20.0-0")
    run_helm(helm, tmp_path, "install", "demo", str(chart), "-n", namespace, "--wait", "--timeout", "60s")
    cm = control_plane.kubectl_json("get", "configmap", "demo-greeting", "-n", namespace)
    assert cm["data"]["greeting"] == "hello"
    run_helm(helm, tmp_path, "uninstall", "demo", "-n", namespace, "--wait", "--timeout", "60s")
    control_plane.kubectl("wait", "--for=delete", "configmap/demo-greeting", "-n", namespace, "--timeout=30s")


def owned_by(owner: dict[str, Any], name: str) -> dict[str, Any]:
    uid = owner["metadata"]["uid"]
    ref = {"apiVersion": API_VERSION, "kind": "Widget", "name": owner["metadata"]["name"], "uid": uid, "controller": True}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "ownerReferences": [ref]}, "data": {"k": "v"}}


def gc_knows_widgets(control_plane: ControlPlane, namespace: str) -> None:
    """Wait until the garbage collector acts on widgets: it learns a new resource type only at its next
    discovery resync (~30 s), and a dependent it looked at before then is retried with an exponential backoff
    that can outlast any sensible timeout. So probe with fresh pairs (a fresh backoff each), each given a few
    seconds, until one is collected; then the real test's dependent is handled at once, whatever ran before."""
    deadline = time.monotonic() + 180
    attempt = 0
    while True:
        attempt += 1
        control_plane.apply(widget(f"probe-{attempt}"), "-n", namespace)
        owner = control_plane.kubectl_json("get", "widget", f"probe-{attempt}", "-n", namespace)
        control_plane.apply(owned_by(owner, f"probe-{attempt}"), "-n", namespace)
        control_plane.kubectl("delete", "widget", f"probe-{attempt}", "-n", namespace, "--cascade=background")
        done = control_plane.kubectl(
            "wait", "--for=delete", f"configmap/probe-{attempt}", "-n", namespace, "--timeout=5s", check=False
        )
        if done.returncode == 0:
            return
        control_plane.kubectl("delete", "configmap", f"probe-{attempt}", "-n", namespace, "--ignore-not-found")
        assert time.monotonic() < deadline, "the garbage collector never acted on widgets within 180 s"


# Order-independent: gc_knows_widgets waits for the garbage collector's discovery instead of relying on the
# tests above having used up its resync period.
def test_owned_object_is_garbage_collected(control_plane: ControlPlane, crd: str, namespace: str) -> None:
    gc_knows_widgets(control_plane, namespace)
    control_plane.apply(widget("owner"), "-n", namespace)
    owner = control_plane.kubectl_json("get", "widget", "owner", "-n", namespace)
    bystander = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bystander"}}
    control_plane.apply(owned_by(owner, "owned"), "-n", namespace)
    control_plane.apply(bystander, "-n", namespace)

    # Background propagation: the owner goes at once, the garbage collector removes the dependent afterwards.
    control_plane.kubectl("delete", "widget", "owner", "-n", namespace, "--cascade=background")
    control_plane.kubectl(
        "wait", "--for=delete", "configmap/owned", "-n", namespace, f"--timeout={GC_TIMEOUT}"
    )
    control_plane.kubectl("get", "configmap", "bystander", "-n", namespace)
