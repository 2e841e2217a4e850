"""A fake of the custom-object calls the WorkflowSchedule controller makes (``*_without_preload_content``, JSON
bodies): objects by (plural, namespace, name) with fresh uids, 409 on a create of an existing name, label selectors
of one ``key=value``, JSON Patch ``add`` of ``/data/<key>``, merge patches of status, deletes with a uid
precondition. Tests plant objects in ``objects`` as a namespace user would through the API."""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.core_pods import FakeResponse
from tests.fakes.kube_client import FakeCore

Key = tuple[str, str, str]  # plural, namespace, name


async def _answer(obj: Any, status: int = 200) -> FakeResponse:
    return FakeResponse(status, json.dumps(obj).encode())


async def _refuse(status: int, message: str) -> FakeResponse:
    return FakeResponse(status, json.dumps({"kind": "Status", "code": status, "message": message}).encode(),
                        reason=message)


@dataclass
class FakeScheduleApi:
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    created: list[Key] = field(default_factory=list)
    deleted: list[Key] = field(default_factory=list)

    def plant(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["namespace"] = namespace
        meta.setdefault("creationTimestamp", "2026-05-01T09:00:00Z")
        self.objects[(plural, namespace, meta["name"])] = obj
        return obj

    def get_namespaced_custom_object_without_preload_content(self, group: str, version: str, namespace: str,
                                                             plural: str, name: str) -> Any:
        obj = self.objects.get((plural, namespace, name))
        return _answer(obj) if obj is not None else _refuse(404, "not found")

    def list_namespaced_custom_object_without_preload_content(self, group: str, version: str, namespace: str,
                                                              plural: str, label_selector: str = "") -> Any:
        key, _, value = label_selector.partition("=")
        items = [o for (p, ns, _), o in self.objects.items() if p == plural and ns == namespace
                 and (not key or o["metadata"].get("labels", {}).get(key) == value)]
        return _answer({"items": items})

    def create_namespaced_custom_object_without_preload_content(self, group: str, version: str, namespace: str,
                                                                plural: str, body: dict[str, Any], **_: Any) -> Any:
        if (plural, namespace, body["metadata"]["name"]) in self.objects:
            return _refuse(409, "already exists")
        obj = self.plant(plural, namespace, body)
        self.created.append((plural, namespace, obj["metadata"]["name"]))
        return _answer(obj, 201)

    def patch_namespaced_custom_object_without_preload_content(self, group: str, version: str, namespace: str,
                                                               plural: str, name: str, ops: Any, **_: Any) -> Any:
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            return _refuse(404, "not found")
        for op in ops:
            assert op["op"] == "add" and op["path"].startswith("/data/"), op
            obj.setdefault("data", {})[op["path"].removeprefix("/data/")] = op["value"]
        return _answer(obj)

    def patch_namespaced_custom_object_status_without_preload_content(self, group: str, version: str, namespace: str,
                                                                      plural: str, name: str, body: Any,
                                                                      **_: Any) -> Any:
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            return _refuse(404, "not found")
        obj.setdefault("status", {}).update(copy.deepcopy(body["status"]))
        return _answer(obj)

    def delete_namespaced_custom_object_without_preload_content(self, group: str, version: str, namespace: str,
                                                                plural: str, name: str, body: Any = None) -> Any:
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            return _refuse(404, "not found")
        uid = getattr(getattr(body, "preconditions", None), "uid", None)
        if uid is not None and uid != obj["metadata"]["uid"]:
            return _refuse(409, "uid precondition")
        del self.objects[(plural, namespace, name)]
        self.deleted.append((plural, namespace, name))
        return _answer({})


@dataclass
class FakeScheduleClient:
    custom: FakeScheduleApi = field(default_factory=FakeScheduleApi)
    core: FakeCore = field(default_factory=FakeCore)
