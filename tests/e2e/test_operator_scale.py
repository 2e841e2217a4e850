"""Acceptance 6: a Workflow of 10,000 tool calls, applied server-side, completes through the operator; its
.status stays under 64 KiB in every version the API server sends to watchers; `dsb --kube history` lists every
record; another field manager re-applies the manifest without a conflict; and the operator owns nothing but
.status and its finalizer.

Marked ``scale`` as well as e2e: it is the slowest test of the suite (docs/testing.md has its time), so it can be
run or left out on its own (``-m scale``, ``-m "e2e and not scale"``); `scripts/test` runs it.
DSB_SCALE_CALLS overrides the number of calls (the acceptance is 10,000; a smaller number gives a quicker run of
the same checks while developing).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from durable_sandbox.kube.api.resources import GROUP, VERSION, WORKFLOWS
from tests.dsb import dsb
from tests.e2e.controlplane import ControlPlane
from tests.e2e.journal_support import OperatorJournal
from tests.e2e.operator_support import condition, namespace, operators

__all__ = ["namespace", "operators"]  # fixtures

pytestmark = pytest.mark.scale

CALLS = int(os.environ.get("DSB_SCALE_CALLS", "10000"))
STATUS_BUDGET = 64 * 1024
ANNOTATION_LIMIT = 256 * 1024


def big_manifest(name: str, calls: int) -> dict[str, Any]:
    # write_file: the local provider's cheapest call (no process), with a body long enough that the whole
    # spec is well past the 256 KiB a client-side apply's annotation may hold.
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {
            "sandbox": {"provider": "local"},
            "snapshotEveryNCalls": max(calls // 4, 1),
            "toolCalls": [
                {"type": "write_file", "path": f"out/{i % 50}.txt", "contents": f"call {i}: " + "x" * 40}
                for i in range(calls)
            ],
        },
    }


def status_size(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj.get("status") or {}, separators=(",", ":")).encode())


class StatusWatch(threading.Thread):
    """Watches one Workflow and records the size of .status in every version of it the API server sends
    (each status write is one MODIFIED event), so no version can exceed the budget unseen."""

    def __init__(self, kubeconfig: Path, ns: str, name: str) -> None:
        super().__init__(daemon=True)
        self.api = k8s.CustomObjectsApi(k8s_config.new_client_from_config(str(kubeconfig)))
        self.ns, self.name = ns, name
        self.sizes: list[int] = []
        self.phases: list[str | None] = []
        self.versions: set[str] = set()
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        resource_version: str | None = None
        while not self.stop.is_set():
            stream = k8s_watch.Watch()
            kwargs: dict[str, Any] = {"field_selector": f"metadata.name={self.name}", "timeout_seconds": 5}
            if resource_version is not None:
                kwargs["resource_version"] = resource_version  # resume where the last watch ended: no gap
            try:
                for event in stream.stream(
                    self.api.list_namespaced_custom_object, GROUP, VERSION, self.ns, WORKFLOWS, **kwargs
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        resource_version = None  # expired: start again from the current version
                        break
                    resource_version = obj["metadata"]["resourceVersion"]
                    self.versions.add(resource_version)
                    self.sizes.append(status_size(obj))
                    self.phases.append((obj.get("status") or {}).get("phase"))
            except k8s.ApiException as exc:
                if exc.status == 410:
                    resource_version = None
                    continue
                self.errors.append(f"{exc.status}: {exc.reason}")
                self.stop.wait(1.0)


def apply_server_side(cp: ControlPlane, ns: str, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl apply --server-side``, again while the API server times out (kubectl apply is idempotent): a busy
    server may not finish validating 10,000 calls within its 60 s request timeout (~20 s at load 10 on 2 cores).
    Any other failure (a conflict) fails the test."""

    def applied() -> subprocess.CompletedProcess[str] | None:
        proc = cp.kubectl("apply", "--server-side", *args, "-n", ns, "-f", str(path), check=False, timeout=300)
        if proc.returncode == 0:
            return proc
        assert "Timeout" in proc.stderr, proc.stderr
        return None

    return cp.wait_until(applied, 900, f"kubectl apply --server-side {' '.join(args)} to go through", interval=5.0)


# The run takes many minutes (docs/testing.md has the time): past pytest-timeout's default of 300 s.
@pytest.mark.timeout(5400)
def test_ten_thousand_calls(control_plane: ControlPlane, namespace: str, operators: Any,
                            operator_journal: OperatorJournal, tmp_path: Path) -> None:
    doc = big_manifest("big", CALLS)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    if CALLS >= 10_000:
        # What the docs warn about: a client-side apply keeps the manifest in an annotation, which is too big.
        assert len(json.dumps(doc)) > ANNOTATION_LIMIT
        proc = control_plane.kubectl("apply", "-n", namespace, "-f", str(path), check=False, timeout=300)
        assert proc.returncode != 0 and "Too long" in proc.stderr, proc.stderr
    watcher = StatusWatch(control_plane.kubeconfig, namespace, "big")
    watcher.start()
    operators("--allow-local-provider")
    started = time.monotonic()
    try:
        apply_server_side(control_plane, namespace, path)

        def done() -> bool:
            failed = condition(control_plane, namespace, "big", "Failed")
            assert failed is None or failed["status"] != "True", failed
            ok = condition(control_plane, namespace, "big", "Succeeded")
            return ok is not None and ok["status"] == "True"

        control_plane.wait_until(done, 3600, f"a {CALLS}-call Workflow to succeed", interval=5.0)
        final = control_plane.kubectl_json("get", "workflow", "big", "-n", namespace, "--show-managed-fields")

        # The watch has seen the final version (the one just read) before it stops: every version counted.
        final_rv = final["metadata"]["resourceVersion"]
        control_plane.wait_until(lambda: final_rv in watcher.versions, 120, "the watch to see the final version")
    finally:
        watcher.stop.set()
        watcher.join(timeout=60)
    elapsed = time.monotonic() - started
    print(
        f"{CALLS} calls in {elapsed:.0f}s ({CALLS / elapsed:.1f} calls/s); {len(watcher.sizes)} versions watched, "
        f".status max {max(watcher.sizes)} bytes; resourceVersion {final_rv}"
    )

    # .status stayed small in every version written, while it ran and at the end.
    assert not watcher.errors, watcher.errors
    assert watcher.phases.count("Running") >= 2, watcher.phases[:20]
    assert max([*watcher.sizes, status_size(final)]) < STATUS_BUDGET, max(watcher.sizes)
    assert final["status"]["calls"] == {"completed": CALLS, "total": CALLS}

    # The whole journal is readable: every call's started and completed record (`dsb --kube` reads a PostgreSQL
    # journal when given the operator's URL).
    where = ("--store", operator_journal.dsn) if operator_journal.dsn else ()
    hist = dsb("--kube", "-n", namespace, *where, "history", "big", "-o", "json", timeout=600, process=True)
    assert hist.returncode == 0, hist.stderr
    records = json.loads(hist.stdout)
    calls = [r for r in records if r["kind"] == "sandbox.call"]
    assert sum(1 for r in calls if r["status"] == "completed") == CALLS
    assert len({r["opId"] for r in calls}) == CALLS
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(1, len(records) + 1))  # no gap, no duplicate

    # GitOps: another field manager applies the same manifest; the operator's status does not conflict.
    proc = apply_server_side(control_plane, namespace, path, "--field-manager=gitops")
    assert "conflict" not in proc.stderr.lower(), proc.stderr
    after = control_plane.kubectl_json("get", "workflow", "big", "-n", namespace, "--show-managed-fields")
    assert after["metadata"]["generation"] == final["metadata"]["generation"]
    appliers = {"kubectl", "gitops"}
    managers = {e["manager"] for e in after["metadata"]["managedFields"]}
    assert appliers <= managers, managers
    for entry in after["metadata"]["managedFields"]:
        if entry["manager"] in appliers:
            continue
        owned = entry.get("fieldsV1", {})
        if entry.get("subresource") == "status":
            assert set(owned) <= {"f:status"}, entry
        else:
            # Outside the status subresource the operator owns only its finalizer.
            assert set(owned) <= {"f:metadata"}, entry
            assert set(owned.get("f:metadata", {})) <= {"f:finalizers"}, entry
