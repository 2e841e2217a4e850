"""The project's custom resources on the API server: the only holder of their API.

Everything that names the group, the version, a plural, a patch content type or a field manager takes it
from here, and every read or write of a custom object (a Workflow, a Sandbox, a Journal) goes through
:class:`CustomObjects`: the Workflow and Sandbox controllers, the kopf handlers, the orphan sweep, the
CLI's ``--kube`` client, and the tests' fakes of the API server (which fake this one class).

Answers are plain JSON (``dict``), never typed models: a Workflow with 10,000 tool calls is ~650 KB,
and the callers validate what they need with the pydantic models of ``kube/spec/models.py``.

This module imports nothing of the ``kubernetes`` package at import time: ``kube/spec/models.py`` takes the
group and version from here, and ``dsb run`` uses the models without the Kubernetes extra installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from durable_sandbox.kube.api.client import KubeClient

GROUP = "durable-sandbox.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

WORKFLOWS = "workflows"
SANDBOXES = "sandboxes"
JOURNALS = "journals"  # the run journal's objects (issue 20)
POOLS = "sandboxpools"  # warm Pods of the kubernetes provider (kube/pool/)
SCHEDULES = "workflowschedules"  # Workflows made on a schedule (kube/schedule/)
PLURALS: Final[Mapping[str, str]] = {"Workflow": WORKFLOWS, "Sandbox": SANDBOXES, "Journal": JOURNALS, "SandboxPool": POOLS,
                                     "WorkflowSchedule": SCHEDULES}
# The finalizer that keeps a Workflow (or a Sandbox) until its sandboxes and snapshots are deleted.
FINALIZER = "durable-sandbox.dev/cleanup"
# The resources kopf serves (their handlers are in kube/handlers.py); discovery must list them first.
SERVED = (WORKFLOWS, SANDBOXES, POOLS, SCHEDULES)

# Patch content types. A JSON Patch whose `test` op fails is answered 422; a stale resourceVersion 409.
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"  # server-side apply (a JSON body is YAML too)
PatchType = Literal["application/merge-patch+json", "application/json-patch+json", "application/apply-patch+yaml"]

# Field managers: who wrote a field, as managedFields (and `kubectl get --show-managed-fields`) say.
OPERATOR_FIELD_MANAGER = "durable-sandbox-operator"  # status of Workflows and Sandboxes, Events
CLI_FIELD_MANAGER = "dsb"  # spec writes of `dsb --kube` (apply, signal, cancel)


def _not_found(exc: BaseException) -> bool:
    # Imported here, not at the top: see the module doc (the kubernetes package is an optional extra).
    from durable_sandbox.kube.api.client import is_not_found

    return is_not_found(exc)


class CustomObjects:
    """The project's custom objects through one API client, as plain JSON.

    Reads answer None for an object that does not exist; writes to a gone object answer None too (a
    controller writing the status of a Workflow that was just deleted has nothing left to do). Every other
    error is the client's ``ApiException`` (``kube/api/client.py`` tells transient ones apart)."""

    def __init__(self, api: KubeClient, *, field_manager: str = OPERATOR_FIELD_MANAGER) -> None:
        self.api = api
        self.field_manager = field_manager

    async def _json(self, call: Any, *, parse: bool = True) -> dict[str, Any]:
        from durable_sandbox.kube.api.client import json_body

        return await json_body(call, parse=parse)

    async def _json_or_none(self, call: Any) -> dict[str, Any] | None:
        """The object ``call`` answers, or None when it is gone (the class docstring says why that is no error)."""
        try:
            return await self._json(call)
        except Exception as exc:
            if _not_found(exc):
                return None
            raise

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json_or_none(self.api.custom.get_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, plural, name))

    async def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The objects of ``namespace`` (None: of every namespace)."""
        custom = self.api.custom
        call = (custom.list_cluster_custom_object_without_preload_content(GROUP, VERSION, plural) if namespace is None
                else custom.list_namespaced_custom_object_without_preload_content(GROUP, VERSION, namespace, plural))
        return list((await self._json(call)).get("items") or [])

    async def patch(self, plural: str, namespace: str, name: str, body: Any, *,
                    patch_type: PatchType = MERGE_PATCH) -> dict[str, Any] | None:
        """Patch the object (its spec or metadata: the status subresource ignores these writes)."""
        return await self._json_or_none(self.api.custom.patch_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, plural, name, body, field_manager=self.field_manager,
            _content_type=patch_type))

    async def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any], *,
                           precondition: str | None = None) -> dict[str, Any] | None:
        """Merge ``status`` into the status subresource; with ``precondition`` (a resourceVersion) only if the
        object is still that version (else 409 Conflict)."""
        body: dict[str, Any] = {"status": dict(status)}
        if precondition is not None:
            body["metadata"] = {"resourceVersion": precondition}
        return await self._json_or_none(
            self.api.custom.patch_namespaced_custom_object_status_without_preload_content(
                GROUP, VERSION, namespace, plural, name, body, field_manager=self.field_manager,
                _content_type=MERGE_PATCH))

    async def create(self, plural: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create the object; None when one of that name exists already (409: the caller reads it and judges it)."""
        from durable_sandbox.kube.api.client import is_conflict

        try:
            return await self._json(self.api.custom.create_namespaced_custom_object_without_preload_content(
                GROUP, VERSION, namespace, plural, dict(body), field_manager=self.field_manager))
        except Exception as exc:
            if is_conflict(exc):
                return None
            raise

    async def apply(self, manifest: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Server-side apply of one manifest (a Workflow or a Sandbox) in ``namespace``; returns the object."""
        body = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
        return await self._json(self.api.custom.patch_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, PLURALS[str(manifest.get("kind"))], manifest["metadata"]["name"], body,
            field_manager=self.field_manager, _content_type=APPLY_PATCH))

    async def delete(self, plural: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete the object (only if its uid is still ``uid``: not a re-created namesake), its dependents in
        the background; False when it was gone."""
        from kubernetes.aio.client import models as k8s_models

        options = k8s_models.V1DeleteOptions(
            propagation_policy="Background",
            preconditions=k8s_models.V1Preconditions(uid=uid) if uid is not None else None,
        )
        try:
            await self._json(self.api.custom.delete_namespaced_custom_object_without_preload_content(
                GROUP, VERSION, namespace, plural, name, body=options), parse=False)
        except Exception as exc:
            if _not_found(exc):
                return False
            raise
        return True


__all__ = [
    "API_VERSION",
    "APPLY_PATCH",
    "CLI_FIELD_MANAGER",
    "FINALIZER",
    "GROUP",
    "JOURNALS",
    "JSON_PATCH",
    "MERGE_PATCH",
    "OPERATOR_FIELD_MANAGER",
    "PLURALS",
    "POOLS",
    "SANDBOXES",
    "SCHEDULES",
    "SERVED",
    "VERSION",
    "WORKFLOWS",
    "CustomObjects",
    "PatchType",
]
