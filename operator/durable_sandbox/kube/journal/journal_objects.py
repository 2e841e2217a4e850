"""Journal objects of one namespace, as plain JSON: the raw calls the store, the leases and the Sandbox
records make.

``Journal`` (``journals.durable-sandbox.dev``) is the operator's own kind, shaped like a ConfigMap (a ``data``
map of strings) plus ``run`` and ``part`` fields for ``kubectl get`` (``kube/spec/crds.py`` says why it exists).
Calls go through the client's ``*_without_preload_content`` variants and are parsed as plain JSON: a run's
head holds tens of KiB of journal, and building typed models of it on every commit would cost more than the
request. ``writes`` counts every write by verb (the store's write budget is measured with it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.aio.client import models as m

from durable_sandbox.kube.api.client import ApiException, KubeClient, is_not_found, json_body
from durable_sandbox.kube.api.resources import API_VERSION, GROUP, JOURNALS, JSON_PATCH, MERGE_PATCH, VERSION

__all__ = ["JOURNALS", "LABEL_PART", "LABEL_RUN", "MANAGED_BY", "MERGE_PATCH", "JournalObjects"]

LABEL_RUN = "durable-sandbox.dev/run-id"
LABEL_PART = "durable-sandbox.dev/part"
MANAGED_BY: Final[Mapping[str, str]] = {"app.kubernetes.io/managed-by": "durable-sandbox"}


class JournalObjects:
    """The Journal objects of ``namespace`` through ``api``."""

    def __init__(self, api: KubeClient, namespace: str, *, field_manager: str = "durable-sandbox") -> None:
        self.api = api
        self.namespace = namespace
        self.field_manager = field_manager
        self.writes: Counter[str] = Counter()

    @staticmethod
    def body(metadata: dict[str, Any], data: dict[str, str], *, run: str | None = None,
             part: str | None = None) -> dict[str, Any]:
        """A Journal object; ``run`` and ``part`` (what ``kubectl get journals`` shows) default to its labels."""
        labels = metadata.get("labels") or {}
        return {"apiVersion": API_VERSION, "kind": "Journal", "metadata": metadata,
                "run": run if run is not None else labels.get(LABEL_RUN, ""),
                "part": part if part is not None else labels.get(LABEL_PART, ""), "data": data}

    async def get(self, name: str) -> dict[str, Any] | None:
        try:
            return await json_body(self.api.custom.get_namespaced_custom_object_without_preload_content(
                GROUP, VERSION, self.namespace, JOURNALS, name))
        except ApiException as exc:
            if is_not_found(exc):
                return None
            raise

    async def select(self, selector: str) -> list[dict[str, Any]]:
        out = await json_body(self.api.custom.list_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, self.namespace, JOURNALS, label_selector=selector))
        return list(out.get("items") or [])

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create it (``body`` as :meth:`body` makes it); 409 if it exists."""
        self.writes["create journal"] += 1
        return await json_body(self.api.custom.create_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, self.namespace, JOURNALS, body, field_manager=self.field_manager))

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        """Replace it, conditional on ``body``'s ``metadata.resourceVersion`` (409 if anyone wrote since)."""
        self.writes["update journal"] += 1
        return await json_body(self.api.custom.replace_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, self.namespace, JOURNALS, body["metadata"]["name"], body,
            field_manager=self.field_manager))

    async def patch(self, name: str, ops: list[dict[str, Any]]) -> None:
        """A JSON Patch (422 when a ``test`` fails; 404 when it is gone). The answer is the whole object (up to a
        full tail): nothing in it is needed, so it is not parsed."""
        self.writes["patch journal"] += 1
        await json_body(self.api.custom.patch_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, self.namespace, JOURNALS, name, ops, field_manager=self.field_manager,
            _content_type=JSON_PATCH), parse=False)

    async def merge(self, name: str, data: dict[str, str | None]) -> None:
        """Merge ``data`` into the object's data (None removes a key); 404 when it is gone."""
        self.writes["patch journal"] += 1
        await json_body(self.api.custom.patch_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, self.namespace, JOURNALS, name, {"data": data}, field_manager=self.field_manager,
            _content_type=MERGE_PATCH), parse=False)

    async def delete(self, name: str, *, resource_version: str | None = None) -> bool:
        """Delete it (only at ``resource_version`` if given: 409 otherwise); False when it was gone."""
        self.writes["delete journal"] += 1
        options = (m.V1DeleteOptions(preconditions=m.V1Preconditions(resource_version=resource_version))
                   if resource_version else None)
        try:
            await json_body(self.api.custom.delete_namespaced_custom_object_without_preload_content(
                GROUP, VERSION, self.namespace, JOURNALS, name, body=options), parse=False)
        except ApiException as exc:
            if is_not_found(exc):
                return False
            raise
        return True

    async def delete_all(self, selector: str) -> None:
        self.writes["deletecollection journal"] += 1
        await json_body(self.api.custom.delete_collection_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, self.namespace, JOURNALS, label_selector=selector), parse=False)
