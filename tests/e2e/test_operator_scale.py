"""Acceptance 6: a Workflow of 10,000 tool calls, applied server-side, completes through the operator; its
.status stays under 64 KiB all along; `dsb --kube history` lists every record; another field manager
re-applies the manifest without a conflict; and the operator owns nothing but .status and the finalizer.

DSB_SCALE_CALLS overrides the number of calls (the acceptance is 10,000; a smaller number gives a quicker
run of the same checks while developing).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import ControlPlane
from tests.e2e.operator_support import condition, dsb, namespace, operators

__all__ = ["namespace", "operators"]  # fixtures

CALLS = int(os.environ.get("DSB_SCALE_CALLS", "10000"))
STATUS_BUDGET = 64 * 1024
ANNOTATION_LIMIT = 256 * 1024


def big_manifest(name: str, calls: int) -> dict[str, Any]:
    # write_file: the local provider's cheapest call (no process), with a body long enough that the whole
    # spec is well past the 256 KiB a client-side apply's annotation may hold.
    return {
        "apiVersion": "durable-sandbox.dev/v1alpha1",
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


class StatusSampler(threading.Thread):
    """Reads the Workflow every half second while it runs and keeps the size of every .status it saw."""

    def __init__(self, cp: ControlPlane, ns: str, name: str) -> None:
        super().__init__(daemon=True)
        self.cp, self.ns, self.name = cp, ns, name
        self.sizes: list[int] = []
        self.phases: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            proc = self.cp.kubectl("get", "workflow", self.name, "-n", self.ns, "-o", "json", check=False)
            if proc.returncode != 0:
                continue
            st = json.loads(proc.stdout).get("status") or {}
            self.sizes.append(len(json.dumps(st, separators=(",", ":")).encode()))
            self.phases.append(str(st.get("phase")))


def test_ten_thousand_calls(control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> None:
    doc = big_manifest("big", CALLS)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    if CALLS >= 10_000:
        # What the docs warn about: a client-side apply keeps the manifest in an annotation, which is too big.
        proc = control_plane.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
        assert proc.returncode != 0 and "Too long" in proc.stderr, proc.stderr
        assert len(json.dumps(doc)) > ANNOTATION_LIMIT
    operators("--allow-local-provider")
    sampler = StatusSampler(control_plane, namespace, "big")
    sampler.start()
    started = time.monotonic()
    try:
        control_plane.kubectl("apply", "--server-side", "-n", namespace, "-f", str(path), timeout=300)

        def done() -> bool:
            failed = condition(control_plane, namespace, "big", "Failed")
            assert failed is None or failed["status"] != "True", failed
            ok = condition(control_plane, namespace, "big", "Succeeded")
            return ok is not None and ok["status"] == "True"

        control_plane.wait_until(done, 3600, f"a {CALLS}-call Workflow to succeed", interval=2.0)
    finally:
        sampler.stop.set()
        sampler.join()
    elapsed = time.monotonic() - started
    print(f"{CALLS} calls in {elapsed:.0f}s; .status max {max(sampler.sizes)} bytes over {len(sampler.sizes)} samples")

    # .status stayed small all along, while it ran and at the end.
    assert sampler.phases.count("Running") >= 3, sampler.phases[:20]
    final = control_plane.kubectl_json("get", "workflow", "big", "-n", namespace, "--show-managed-fields")
    sizes = [*sampler.sizes, len(json.dumps(final["status"], separators=(",", ":")).encode())]
    assert max(sizes) < STATUS_BUDGET, max(sizes)
    assert final["status"]["calls"] == {"completed": CALLS, "total": CALLS}

    # The whole journal is readable: every call's started and completed record.
    hist = dsb("--kube", "-n", namespace, "history", "big", "-o", "json", timeout=600)
    assert hist.returncode == 0, hist.stderr
    records = json.loads(hist.stdout)
    calls = [r for r in records if r["kind"] == "sandbox.call"]
    assert sum(1 for r in calls if r["status"] == "completed") == CALLS
    assert len({r["opId"] for r in calls}) == CALLS
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(1, len(records) + 1))  # no gap, no duplicate

    # GitOps: another field manager applies the same manifest; the operator's status does not conflict.
    proc = control_plane.kubectl(
        "apply", "--server-side", "--field-manager=gitops", "-n", namespace, "-f", str(path), check=False, timeout=300
    )
    assert proc.returncode == 0 and "conflict" not in proc.stderr.lower(), proc.stderr
    after = control_plane.kubectl_json("get", "workflow", "big", "-n", namespace, "--show-managed-fields")
    assert after["metadata"]["generation"] == final["metadata"]["generation"]
    appliers = {"kubectl", "gitops"}
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
