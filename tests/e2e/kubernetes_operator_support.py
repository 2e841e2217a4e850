"""The operator with the kubernetes provider on the test node, snapshots in a real S3 server (versitygw on loopback):
the ``cluster`` fixture of ``test_operator_kubernetes_provider.py`` and ``test_session_durability_node.py``."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_sandbox.providers.kubernetes import SANDBOX_LABEL
from durable_sandbox.providers.s3_snapshots import S3SnapshotStore
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import OperatorProcess
from tests.e2e.sandbox_support import IMAGE
from tests.objectstore import S3Server

__all__ = ["EXAMPLE", "ROOT", "Cluster", "cluster"]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kubernetes-workflow.yaml"


class Cluster:
    def __init__(self, cp: ControlPlane, ns: str, s3: S3Server, start: Any) -> None:
        self.cp, self.ns, self.s3, self.start = cp, ns, s3, start
        self.bucket = "op-" + secrets.token_hex(5)

    def operator(self, *args: str, fault: str | None = None, home: Path | None = None, name: str | None = None,
                 resources: dict[str, Any] | None = None, **extra: str) -> OperatorProcess:
        """An operator for this namespace; ``resources``: the sandbox Pods' (the template's default request, 100m
        of CPU, fits few Pods on the 2-core node)."""
        env = {**self.s3.environ(self.bucket, prefix="dsb"), "DSB_K8S_NAMESPACES": self.ns, **extra,
               # The node's control plane, whatever KUBECONFIG the session's plain one set.
               "KUBECONFIG": str(self.cp.kubeconfig),
               "DSB_K8S_TEMPLATE": json.dumps({"image": IMAGE, "imagePullPolicy": "Never",
                                                **({"resources": resources} if resources else {})})}
        op: OperatorProcess = self.start(*args, env=env, fault=fault, home=home, name=name)
        return op

    def workflow(self, name: str, **spec: Any) -> dict[str, Any]:
        doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["name"] = name
        doc["spec"]["sandbox"].pop("template")  # the operator's default template: the image on the node
        doc["spec"].update(spec)
        return doc

    def pods(self) -> list[str]:
        items = self.cp.kubectl_json("get", "pods", "-n", self.ns, "-l", f"{SANDBOX_LABEL}=true")["items"]
        return [p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")]

    def objects(self) -> list[str]:
        root = self.s3.data / self.bucket
        return sorted(str(p.relative_to(root)) for p in root.rglob("*.tar")) if root.exists() else []


@pytest.fixture
def cluster(control_plane: ControlPlane, node: str, namespace: str, operators: Any,
            s3_server: S3Server) -> Iterator[Cluster]:
    scene = Cluster(control_plane, namespace, s3_server, operators)

    async def make_bucket() -> None:
        store = S3SnapshotStore(s3_server.config(scene.bucket))
        try:
            await store.ensure_bucket()
        finally:
            await store.aclose()

    asyncio.run(make_bucket())
    yield scene
