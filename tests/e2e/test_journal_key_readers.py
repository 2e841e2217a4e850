"""Issue 32, item 8, against the real API server: who else may read the journal key (kube/journal/journal_key_readers.py),
asked as `dsb operator` asks at start-up, and the operator refusing to start when someone may."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_sandbox.kube.journal.journal_key_readers import Subject, readers_of
from tests.dsb import dsb
from tests.e2e.controlplane import fresh_namespace

from .controlplane import ControlPlane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    with fresh_namespace(control_plane, "jkey") as name:
        control_plane.kubectl("create", "secret", "generic", "journal-key", "-n", name,
                              "--from-literal=key=" + "k" * 32)
        yield name


def can_get_key(cp: ControlPlane, namespace: str, who: str) -> bool:
    out = cp.kubectl("auth", "can-i", "get", "secret/journal-key", "-n", namespace, "--as", who, check=False)
    return out.stdout.strip() == "yes"


async def test_a_namespace_editor_can_read_the_key_and_is_named(control_plane: ControlPlane, namespace: str) -> None:
    kubeconfig = str(control_plane.kubeconfig)
    control_plane.kubectl("create", "rolebinding", "viewers", "-n", namespace, "--clusterrole=view", "--user=bob")
    assert await readers_of(namespace, "journal-key", kubeconfig=kubeconfig) == [], "view reads no Secret"
    control_plane.kubectl("create", "rolebinding", "editors", "-n", namespace, "--clusterrole=edit", "--user=alice")
    control_plane.wait_until(lambda: can_get_key(control_plane, namespace, "alice"), 30, "the edit binding")
    assert await readers_of(namespace, "journal-key", kubeconfig=kubeconfig) == [Subject("User", "alice")]


def test_the_operator_refuses_to_start_with_a_key_others_can_read(control_plane: ControlPlane, namespace: str,
                                                                 tmp_path: Path) -> None:
    control_plane.kubectl("create", "rolebinding", "editors", "-n", namespace, "--clusterrole=edit", "--user=alice")
    control_plane.wait_until(lambda: can_get_key(control_plane, namespace, "alice"), 30, "the edit binding")
    ran = dsb("operator", "-n", f"{namespace}-served", "--journal-key-secret", f"{namespace}/journal-key",
              process=True, timeout=120, home=tmp_path, env={"KUBECONFIG": str(control_plane.kubeconfig)})
    assert ran.exit_code != 0, ran.output
    assert f"Secret {namespace}/journal-key can be read by User alice" in ran.output, ran.output
