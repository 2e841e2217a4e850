"""A fake of :class:`durable_sandbox.kube.api.resources.CustomObjects` for unit tests of the controllers.

It fakes the one class every custom-object read and write goes through (not the generated client below
it), so a test states what the API server holds and answers in plain JSON, as the controllers see it:
``objects[(plural, namespace, name)]``, with ``failures`` answered first (an ``ApiException`` each, e.g. a
503 of an API server that is restarting). Every call is recorded in ``calls``.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from durable_sandbox.kube.api.resources import MERGE_PATCH, CustomObjects, PatchType

Key = tuple[str, str, str]  # plural, namespace, name


class FakeCustomObjects(CustomObjects):
    def __init__(self, objects: Mapping[Key, dict[str, Any]] | None = None) -> None:
        self.objects: dict[Key, dict[str, Any]] = {k: copy.deepcopy(v) for k, v in (objects or {}).items()}
        self.failures: list[ApiException] = []  # raised, oldest first, by the next calls
        self.calls: list[tuple[str, Key]] = []  # (verb, key) of every call, in order
        self.called = asyncio.Event()  # set on every call (clear it to wait for the next one)
        self.field_manager = "fake"

    def _call(self, verb: str, key: Key) -> None:
        self.calls.append((verb, key))
        self.called.set()
        if self.failures:
            raise self.failures.pop(0)

    def reads(self, plural: str | None = None) -> int:
        return sum(1 for verb, key in self.calls if verb == "get" and plural in (None, key[0]))

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (plural, namespace, name)
        self._call("get", key)
        found = self.objects.get(key)
        return copy.deepcopy(found) if found is not None else None

    async def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        self._call("list", (plural, namespace or "", ""))
        return [copy.deepcopy(v) for (p, ns, _), v in sorted(self.objects.items())
                if p == plural and namespace in (None, ns)]

    async def patch(self, plural: str, namespace: str, name: str, body: Any, *,
                    patch_type: PatchType = MERGE_PATCH) -> dict[str, Any] | None:
        raise NotImplementedError("no controller patches spec or metadata; add it when one does")

    async def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any], *,
                           precondition: str | None = None) -> dict[str, Any] | None:
        key = (plural, namespace, name)
        self._call("patch_status", key)
        found = self.objects.get(key)
        if found is None:
            return None
        if precondition is not None and found.get("metadata", {}).get("resourceVersion") != precondition:
            raise ApiException(status=409, reason="Conflict")
        found["status"] = {**(found.get("status") or {}), **copy.deepcopy(dict(status))}
        return copy.deepcopy(found)

    async def delete(self, plural: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        key = (plural, namespace, name)
        self._call("delete", key)
        found = self.objects.get(key)
        if found is None:
            return False
        if uid is not None and found.get("metadata", {}).get("uid") != uid:
            raise ApiException(status=409, reason="Conflict")
        del self.objects[key]
        return True
