"""Workflow objects as a client uses them: apply a manifest, find a Workflow by name or run id, signal it,
cancel, suspend or resume it, list them. ``dsb --kube`` talks to a cluster through this (and reads runs through
``KubernetesStore``, as the operator writes them); the operator never writes spec, so these are the only
spec writes the package makes.

Every spec write is one request the API server judges with the CRD's rules and the admission policy:
signals only gain keys, ``cancel`` only goes to true.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable_sandbox.engine.errors import SignalConflict
from durable_sandbox.kube.api.client import ApiException, KubeClient, is_precondition_failed
from durable_sandbox.kube.api.resources import CLI_FIELD_MANAGER, JSON_PATCH, WORKFLOWS, CustomObjects
from durable_sandbox.kube.spec.plan import cluster_run_id

__all__ = ["NoSuchWorkflow", "WorkflowClient", "run_id_of"]

# A signal races another writer of spec.signals (a second `dsb signal`, kubectl patch): the JSON Patch
# tests the resourceVersion it read, and a lost race is retried against the new object.
SIGNAL_ATTEMPTS = 10


class NoSuchWorkflow(LookupError):
    """No Workflow has this name or run id in the namespace."""


def run_id_of(obj: Mapping[str, Any]) -> str:
    """The run id of a Workflow object: ``<name>-<uid[:8]>`` (status.runId says the same once the operator ran)."""
    meta = obj["metadata"]
    return str((obj.get("status") or {}).get("runId") or cluster_run_id(meta["name"], meta["uid"]))


def _pointer(key: str) -> str:
    """A JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


class WorkflowClient:
    """Workflows (and Sandboxes) of one namespace."""

    def __init__(self, api: KubeClient, namespace: str, *, field_manager: str = CLI_FIELD_MANAGER) -> None:
        self.api = api
        self.namespace = namespace
        self.objects = CustomObjects(api, field_manager=field_manager)

    async def get(self, name: str) -> dict[str, Any] | None:
        return await self.objects.get(WORKFLOWS, self.namespace, name)

    async def list(self) -> list[dict[str, Any]]:
        return await self.objects.list(WORKFLOWS, self.namespace)

    async def find(self, ref: str) -> dict[str, Any]:
        """The Workflow named ``ref``, or the one whose run id is ``ref``."""
        obj = await self.get(ref)
        if obj is not None:
            return obj
        for candidate in await self.list():
            if run_id_of(candidate) == ref:
                return candidate
        raise NoSuchWorkflow(
            f"No Workflow named {ref!r} and none whose run id is {ref!r} in namespace {self.namespace!r} "
            f"(`dsb --kube -n {self.namespace} runs` lists them)"
        )

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of one Workflow or Sandbox manifest (field manager ``dsb``); returns the object.

        Server-side, like ``kubectl apply --server-side``: a client-side apply keeps the whole manifest in an
        annotation, which a large spec (10,000 tool calls) takes past the 256 KiB annotation limit."""
        return await self.objects.apply(manifest, self.namespace)

    async def signal(self, name: str, callback_id: str, value: Any) -> bool:
        """Set ``spec.signals[callback_id]``; False when it already has this value. A different value for a
        signalled callback raises SignalConflict (admission would refuse it too)."""
        for _ in range(SIGNAL_ATTEMPTS):
            obj = await self.get(name)
            if obj is None:
                raise NoSuchWorkflow(f"Workflow {self.namespace}/{name} is gone")
            signals = (obj.get("spec") or {}).get("signals")
            if signals is not None and callback_id in signals:
                if signals[callback_id] == value:
                    return False
                raise SignalConflict(run_id_of(obj), callback_id)
            rv = obj["metadata"]["resourceVersion"]
            op = (
                {"op": "add", "path": "/spec/signals", "value": {callback_id: value}}
                if signals is None
                else {"op": "add", "path": f"/spec/signals/{_pointer(callback_id)}", "value": value}
            )
            try:
                patched = await self.objects.patch(
                    WORKFLOWS, self.namespace, name,
                    [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, op], patch_type=JSON_PATCH,
                )  # fmt: skip
            except ApiException as exc:
                if is_precondition_failed(exc) and "resourceVersion" in str(exc.body):
                    continue  # changed since we read it: judge again against the new object
                raise
            if patched is None:
                raise NoSuchWorkflow(f"Workflow {self.namespace}/{name} is gone")
            return True
        raise RuntimeError(f"spec.signals of Workflow {self.namespace}/{name} kept changing; try again")

    async def cancel(self, name: str) -> None:
        """Set ``spec.cancel: true`` (it can never go back)."""
        await self._merge_spec(name, {"cancel": True})

    async def suspend(self, name: str, suspend: bool) -> None:
        """Set ``spec.suspend``: true stops the run at its next call boundary with its sandbox hibernated
        (as batch/v1 Job's ``suspend``), false lets the operator continue it."""
        await self._merge_spec(name, {"suspend": suspend})

    async def _merge_spec(self, name: str, fields: Mapping[str, Any]) -> None:
        if await self.objects.patch(WORKFLOWS, self.namespace, name, {"spec": dict(fields)}) is None:
            raise NoSuchWorkflow(f"Workflow {self.namespace}/{name} is gone")
