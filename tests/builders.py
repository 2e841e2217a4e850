"""One way to write a Workflow in a test: as the object a manifest holds (``workflow``) or as the operator's
validated model (``workflow_resource``). Tests that start from the example manifest use
``tests.e2e.operator_support.manifest`` (the example with edits)."""

from __future__ import annotations

from typing import Any

from durable_sandbox.kube.spec.models import WorkflowResource

__all__ = ["API_VERSION", "workflow", "workflow_resource"]

API_VERSION = "durable-sandbox.dev/v1alpha1"


def workflow(name: str = "demo", *, namespace: str | None = None, uid: str | None = None,
             generation: int | None = None, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A Workflow object: ``spec`` as given (camelCase keys, as in a manifest), metadata only where given."""
    meta: dict[str, Any] = {"name": name}
    for key, value in (("namespace", namespace), ("uid", uid), ("generation", generation)):
        if value is not None:
            meta[key] = value
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": meta, "spec": spec}
    if status is not None:
        doc["status"] = status
    return doc


def workflow_resource(name: str = "demo", *, namespace: str = "team", uid: str | None = "0123456789abcdef",
                      **spec: Any) -> WorkflowResource:
    """The same Workflow as the operator reads it (validated against the model the CRDs are generated from)."""
    return WorkflowResource.model_validate(workflow(name, namespace=namespace, uid=uid, **spec))
