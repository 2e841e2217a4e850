"""Shared pieces for the KubernetesStore e2e tests: a namespace per test, a manual monotonic clock, and the
journal key the tests' stores seal with (as the operator's do)."""

from __future__ import annotations

import time
import uuid

from tests.e2e.controlplane import ControlPlane

# Every store in these tests seals its values (kube/journal/sealing.py), as the operator's always does.
TEST_JOURNAL_KEY = b"durable-sandbox e2e journal key!"


class ManualMonotonic:
    """A monotonic clock the test moves: lease expiry without sleeping (the stores judge expiry by it)."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


_crds_installed: set[str] = set()  # the control planes (by server URL) that have the CRDs, Journal's included


def namespace_with_crds(control_plane: ControlPlane, prefix: str) -> str:
    if control_plane.server not in _crds_installed:
        from tests.e2e.operator_support import install_crds

        install_crds(control_plane)  # the store keeps its objects in the Journal kind
        _crds_installed.add(control_plane.server)
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    return name


def drop_namespace(control_plane: ControlPlane, name: str) -> None:
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
