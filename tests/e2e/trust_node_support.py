"""The trust kit's cluster (tests/unit/trust_support.py's ``Cluster``) on a real API server: what a namespace user
does, through kubectl, to real Pods and Secrets, and the Warning Events the operator wrote about them."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.e2e.controlplane import ControlPlane
from tests.e2e.sandbox_support import IMAGE
from tests.unit.trust_support import HOSTILE_SPEC

# The forgeries run on the node: the node's image (nothing is pulled), with the host's network.
NODE_HOSTILE_SPEC: dict[str, Any] = copy.deepcopy(HOSTILE_SPEC)
NODE_HOSTILE_SPEC["containers"][0].update(image=IMAGE, imagePullPolicy="Never")


class KubectlCluster:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def _one(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        items = self.cp.kubectl_json("get", kind, "-n", namespace, "--field-selector", f"metadata.name={name}")["items"]
        return dict(items[0]) if items else None

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("pods", namespace, name)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"]["namespace"]
        clean = copy.deepcopy(body)
        for key in ("uid", "resourceVersion", "creationTimestamp", "ownerReferences", "managedFields"):
            clean["metadata"].pop(key, None)
        clean.pop("status", None)
        created: dict[str, Any] = json.loads(self.cp.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                                                             input=json.dumps(clean)).stdout)
        return created

    def delete(self, namespace: str, name: str) -> None:
        self.cp.kubectl("delete", "pod", name, "-n", namespace, "--grace-period=0", "--force", "--wait=true")

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        patched: dict[str, Any] = json.loads(self.cp.kubectl("patch", "pod", name, "-n", namespace, "--type=merge",
                                                             "-p", json.dumps(patch), "-o", "json").stdout)
        return patched

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._one("secrets", namespace, name)

    def delete_secret(self, namespace: str, name: str) -> None:
        self.cp.kubectl("delete", "secret", name, "-n", namespace, "--ignore-not-found", "--wait=true")

    def warnings(self, namespace: str, name: str) -> list[str]:
        items = self.cp.kubectl_json("get", "events", "-n", namespace, "--field-selector",
                                     f"involvedObject.name={name},type=Warning")["items"]
        return [str(e.get("message")) for e in items]
