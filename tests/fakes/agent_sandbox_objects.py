"""A fake of kubernetes-sigs/agent-sandbox (v1.0.1) as the ``agent-sandbox`` provider sees it: its SandboxClaims and
Sandboxes (``providers/agent_sandbox_objects.ClaimObjects``) beside the fake core API's Pods (``core_pods.FakeCore``),
and its claim controller's part, done at once: a claim made is bound (``bind``) on the next read unless
``auto_bind`` is off: a Sandbox controlled by the claim, a running Pod controlled by that Sandbox (its first
container ``main``), the claim Ready with ``status.sandbox.name``. What the API server does that the provider leans on:
fresh uids, 409 for a create of an existing name, a merge patch carrying ``metadata.uid`` is refused (409) for
another uid, a delete with a uid precondition likewise, and deleting a claim deletes its Sandbox and Pod (the garbage
collector, at once). Tests edit objects directly in ``objects`` and ``core.pods``, as a namespace user would."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from tests.fakes.core_pods import FakeCore, _merge, _selected

Key = tuple[str, str, str]  # plural, namespace, name
CONTAINER = "main"


def owner_ref(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "x", "kind": kind, "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True}


class FakeClaimObjects:
    def __init__(self, core: FakeCore, *, auto_bind: bool = True) -> None:
        self.core = core
        self.auto_bind = auto_bind
        self.objects: dict[Key, dict[str, Any]] = {}
        self.calls: list[tuple[str, Key]] = []

    # ------------------------------------------------------------------ agent-sandbox's controller, at once

    def bind(self, namespace: str, name: str, *, sandbox_name: str | None = None) -> dict[str, Any]:
        """Bind claim ``name`` as its controller would: a Sandbox and a Pod (``sandbox_name``: a warm one's name)."""
        claim = self.objects[("sandboxclaims", namespace, name)]
        box = sandbox_name or name
        sandbox = self.core.stamp({"metadata": {"name": box, "namespace": namespace,
                                                "ownerReferences": [owner_ref("SandboxClaim", claim)]}})
        self.objects[("sandboxes", namespace, box)] = sandbox
        self.core.put_pod({"metadata": {"name": box, "namespace": namespace,
                                        "ownerReferences": [owner_ref("Sandbox", sandbox)]},
                           "spec": {"containers": [{"name": CONTAINER, "image": "busybox"}]}})
        claim["status"] = {"sandbox": {"name": box},
                           "conditions": [{"type": "Ready", "status": "True", "reason": "SandboxReady"}]}
        return claim

    def expire(self, namespace: str, name: str) -> None:
        claim = self.objects[("sandboxclaims", namespace, name)]
        claim["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "ClaimExpired"}]

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(("sandboxclaims", namespace, name))

    def delete_by_hand(self, namespace: str, name: str) -> None:
        self._remove(("sandboxclaims", namespace, name))

    def _remove(self, key: Key) -> None:
        found = self.objects.pop(key)
        uid = found["metadata"]["uid"]
        for other, obj in list(self.objects.items()):  # the garbage collector: what the claim controls
            if any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or []):
                self._remove(other)
        for pod_key, pod in list(self.core.pods.items()):
            if any(r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or []):
                self.core.pods.pop(pod_key)

    # ------------------------------------------------------------------ ClaimObjects

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (plural, namespace, name)
        self.calls.append(("get", key))
        found = self.objects.get(key)
        if found is not None and plural == "sandboxclaims" and self.auto_bind and not found.get("status"):
            self.bind(namespace, name)
        return copy.deepcopy(self.objects.get(key))

    async def create(self, plural: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        key = (plural, namespace, body["metadata"]["name"])
        self.calls.append(("create", key))
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        obj = self.core.stamp(copy.deepcopy(dict(body)))
        obj["metadata"]["uid"] = str(uuid.uuid4())
        self.objects[key] = obj
        return copy.deepcopy(obj)

    async def patch(self, plural: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        key = (plural, namespace, name)
        self.calls.append(("patch", key))
        found = self.objects.get(key)
        if found is None:
            return None
        patch = copy.deepcopy(dict(body))
        uid = (patch.get("metadata") or {}).pop("uid", None)
        if uid is not None and uid != found["metadata"]["uid"]:
            raise ApiException(status=409, reason="Conflict: Precondition failed: UID in precondition")
        _merge(found, patch)
        return copy.deepcopy(found)

    async def delete(self, plural: str, namespace: str, name: str, *, uid: str) -> bool:
        key = (plural, namespace, name)
        self.calls.append(("delete", key))
        found = self.objects.get(key)
        if found is None or found["metadata"]["uid"] != uid:
            return False
        self._remove(key)
        return True

    async def list(self, plural: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list", (plural, namespace, "")))
        return [copy.deepcopy(o) for (p, ns, _), o in self.objects.items()
                if p == plural and ns == namespace and _selected(o["metadata"].get("labels") or {}, selector)]
