"""Sandbox resources as the e2e tests drive them with kubectl: a manifest, its object and status, waiting for
a condition, suspending it; and the image the kubernetes provider's sandbox Pods run in these tests."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane, ReadFailed
from tests.e2e.node_support import BUSYBOX, NodeCluster, busybox_image

# The node harness builds it from the host's busybox and imports it (tests/e2e/node_support.py, nothing is
# pulled); DSB_TEST_SANDBOX_IMAGE names another, already on the node.
IMAGE = os.environ.get("DSB_TEST_SANDBOX_IMAGE", BUSYBOX)


def sandbox_image(cluster: NodeCluster) -> str:
    """The sandbox Pods' image, on the node: the busybox test image is built and imported here."""
    return busybox_image(cluster) if IMAGE == BUSYBOX else IMAGE


# Fixtures for the modules whose sandboxes are Pods: they import them and name them in their __all__.
@pytest.fixture(scope="module", name="control_plane")
def control_plane_on_the_node(node_cluster: NodeCluster) -> NodeCluster:
    """The node's control plane stands in for the plain one in the importing module (and in every fixture it
    uses): sandbox Pods must really run. A node that cannot be prepared errors these tests, never skips them."""
    return node_cluster


@pytest.fixture(scope="module")
def node(node_cluster: NodeCluster) -> str:
    """The sandbox image is on the node; the node's name."""
    sandbox_image(node_cluster)
    return node_cluster.node


def sandbox(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "durable-sandbox.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"provider": "local", **spec},
    }


def get(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    with contextlib.suppress(ReadFailed):
        return cp.read(f"/apis/durable-sandbox.dev/v1alpha1/namespaces/{ns}/sandboxes/{name}")
    proc = cp.kubectl("get", "dsbx", name, "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def status(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    st: dict[str, Any] = (get(cp, ns, name) or {}).get("status") or {}
    return st


def wait_for(cp: ControlPlane, ns: str, name: str, ctype: str, value: str = "true", timeout: float = 90) -> dict[str, Any]:
    """`kubectl wait --for=condition=<type>=<value>` on the Sandbox; returns its status."""
    proc = cp.kubectl("wait", f"--for=condition={ctype}={value}", f"dsbx/{name}", "-n", ns, f"--timeout={int(timeout)}s",
                      check=False, timeout=timeout + 30)
    if proc.returncode != 0:
        raise AssertionError(f"Sandbox {ns}/{name} never got {ctype}={value}: {proc.stderr}\n"
                             f"status: {json.dumps(status(cp, ns, name))[:3000]}")
    return status(cp, ns, name)


def set_suspend(cp: ControlPlane, ns: str, name: str, value: bool) -> None:
    cp.kubectl("patch", "dsbx", name, "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"suspend": value}}))
