"""Shared pieces for the KubernetesStore e2e tests: a namespace per test and a manual monotonic clock."""

from __future__ import annotations

import time
import uuid

from tests.e2e.conftest import ControlPlane


class ManualMonotonic:
    """A monotonic clock the test moves: lease expiry without sleeping (the stores judge expiry by it)."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fresh_namespace(control_plane: ControlPlane, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    return name


def drop_namespace(control_plane: ControlPlane, name: str) -> None:
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
