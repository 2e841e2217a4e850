"""Child workflows in the cluster: a child run (``ctx.child_workflow``, ``ctx.start_child``) is a ``Workflow``
object of its own, made by the operator when the parent's run starts it (the engine's ``ChildPlacement``
extension, engine/children.py).

The child object is named after the parent and the operation (``<parent>-<op>-<hash of parent uid and op>``,
the same on every replay), has the parent as its controlling owner (uid, ``controller``,
``blockOwnerDeletion``) and the ``durable-sandbox.dev/cleanup`` finalizer, so deleting the parent deletes every
child and each child's finalizer cleans its sandboxes and snapshots. Its spec is the child's program
(``entrypoint``, ``input``): fixed at creation like any Workflow's (the CRD's rules and the admission policy). Its
run is the object's own (run id ``<name>-<uid[:8]>``), owned by it; the Workflow controller serves it like any
other (status, signals, cancel), and the parent's process may execute it meanwhile (one at a time: the run's
Lease and the executor's in-process guard).

**Never created twice.** A crash after the object's creation and before the parent journals the child's start
makes the replay create the same name again: the API server answers 409 and the object found is adopted, but
only when it is what this operation would create: its controlling owner is the parent's uid, its spec is the
child's program, and it carries the operator's seal (``durable-sandbox.dev/child-seal``: an HMAC under the
namespace's journal key over the parent's uid, the child's name, the operation and its program, written into the
object when the operator creates it, before its uid exists). Anyone who may create Workflows can write the
ownerReference and the spec of a namesake before the parent gets there, but not the seal. Anything else is
refused, with what to do: the parent's step fails with it, and a Warning Event ``ChildNotAdopted`` on the parent
Workflow says it. (Without a journal key the seal is the digest alone and proves nothing, as every seal then.)

**Identity is the parent's journal.** The run id the parent journals is the adopted object's, and what the
parent takes as the child's result is that run's sealed record. The label ``durable-sandbox.dev/parent`` is only
for ``kubectl get dwf -l durable-sandbox.dev/parent=<parent>``: a Workflow labelled so but not created for the
parent is never looked at here, and its result never reaches the parent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from durable_sandbox.engine.children import PARENT_LABEL, ChildPlacement
from durable_sandbox.engine.errors import RunConflict, StoreUnavailable
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.kube.api.client import ApiException, brief, is_transient
from durable_sandbox.kube.api.resources import API_VERSION, FINALIZER, WORKFLOWS, CustomObjects
from durable_sandbox.kube.journal.sealing import Sealer
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.spec.models import WorkflowSpec
from durable_sandbox.kube.spec.plan import WORKFLOW_LABEL, cluster_run_id
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.kube.store.refusals import api_message
from durable_sandbox.kube.workflow.runs import Runs

__all__ = ["SEAL_ANNOTATION", "ChildNotAdoptable", "ChildObjects", "child_body", "child_object_name", "child_seal",
           "not_adoptable"]

PARENT_RUN_ANNOTATION = "durable-sandbox.dev/parent-run"
OPERATION_ANNOTATION = "durable-sandbox.dev/child-operation"
SEAL_ANNOTATION = "durable-sandbox.dev/child-seal"
REFUSED_REASON = "ChildNotAdopted"
_NAME_MAX = 63  # a DNS label: the name is also the value of durable-sandbox.dev/workflow
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class ChildNotAdoptable(RunConflict):
    """A Workflow of the child's name exists and is not the child this operation would create."""


def child_object_name(parent_name: str, parent_uid: str, op_id: str) -> str:
    """The child's Workflow name: readable (parent and operation) and unique per parent object and operation
    (a hash of the parent's uid and the operation id), at most 63 characters."""
    digest = hashlib.sha256(f"{parent_uid}\0{op_id}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", op_id.lower()).strip("-")
    base = f"{parent_name}-{slug}" if slug else parent_name
    return f"{base[: _NAME_MAX - len(digest) - 1].rstrip('-.')}-{digest}"


def child_spec(record: RunRecord) -> dict[str, Any]:
    """The child's program as a Workflow spec: its entrypoint and input."""
    return {"entrypoint": record.workflow_ref or record.workflow, "input": record.input}


def child_seal(journal_key: bytes | None, namespace: str, parent_uid: str, name: str, op_id: str,
               record: RunRecord) -> str:
    """The seal the operator writes into the child it creates (see the module): an HMAC under ``namespace``'s key
    over the parent's uid, the child's name, the operation and its program (a digest of them, without a key)."""
    program = json.dumps(_spec_of(child_spec(record)), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(f"{name}\0{op_id}\0{program}".encode()).hexdigest()[:32]
    return Sealer(journal_key, namespace).seal(parent_uid, "child-workflow", digest)


def child_body(parent: OwnerRef, namespace: str, parent_run_id: str, op_id: str,
               record: RunRecord, journal_key: bytes | None = None) -> dict[str, Any]:
    """The child's Workflow object, as the operator creates it (sealed with ``journal_key``)."""
    labels = {PARENT_LABEL: parent.name} if _LABEL_VALUE.match(parent.name) else {}
    name = child_object_name(parent.name, parent.uid, op_id)
    return {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {PARENT_RUN_ANNOTATION: parent_run_id, OPERATION_ANNOTATION: op_id[:1024],
                            SEAL_ANNOTATION: child_seal(journal_key, namespace, parent.uid, name, op_id, record)},
            "ownerReferences": [{**parent.to_json(), "controller": True, "blockOwnerDeletion": True}],
            "finalizers": [FINALIZER],
        },
        "spec": child_spec(record),
    }


def _spec_of(spec: Any) -> dict[str, Any]:
    """A spec as the models read it, defaults left out (the API server may write defaults into it)."""
    return WorkflowSpec.model_validate(spec or {}).model_dump(mode="json", by_alias=True, exclude_defaults=True)


def not_adoptable(found: Mapping[str, Any], parent_uid: str, record: RunRecord, op_id: str,
                  journal_key: bytes | None = None) -> str | None:
    """Why the Workflow ``found`` under the child's name is not this operation's child (None: it is)."""
    meta = found.get("metadata") or {}
    controllers = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
    if not controllers or controllers[0].get("uid") != parent_uid:
        return "its controlling owner is not the parent Workflow"
    seal = (meta.get("annotations") or {}).get(SEAL_ANNOTATION)
    expected = child_seal(journal_key, str(meta.get("namespace") or ""), parent_uid, str(meta.get("name") or ""),
                          op_id, record)
    if not isinstance(seal, str) or not hmac.compare_digest(seal, expected):
        return (f"it does not carry the operator's seal ({SEAL_ANNOTATION}), so the operator did not create it "
                f"for this parent (someone else made a Workflow of that name)")
    try:
        same = _spec_of(found.get("spec")) == _spec_of(child_spec(record))
    except ValueError:
        same = False
    if not same:
        return "its spec is not the child's program (entrypoint and input)"
    if meta.get("deletionTimestamp"):
        return "it is being deleted"
    return None


class ChildObjects:
    """Makes each child run of a run this replica executes a Workflow object (``placement`` for the engine)."""

    def __init__(self, objects: CustomObjects, runs: Runs, store_for: Callable[[str], Any],
                 journal_key: bytes | None = None,
                 emit: Callable[[Mapping[str, Any], LifecycleEvent], None] | None = None) -> None:
        self.objects = objects
        self.runs = runs
        self._store_for = store_for  # the namespace's store (the engine's: commits are observed)
        self._journal_key = journal_key  # seals the children made here (see the module)
        self._emit = emit  # an Event about a Workflow (the Publisher's)

    def placement(self, namespace: str) -> ChildPlacement:
        async def create(record: RunRecord, parent_run_id: str, op_id: str) -> RunRecord:
            return await self.create(namespace, record, parent_run_id, op_id)

        return ChildPlacement(create)

    async def create(self, namespace: str, record: RunRecord, parent_run_id: str, op_id: str) -> RunRecord:
        """The child's Workflow (created, or adopted after a crash) and its run (created unless it exists). An API
        server that cannot be reached is ``StoreUnavailable`` (the parent's execution stops and resumes from its
        journal, never fails); a refusal says what the operator lacks."""
        try:
            return await self._create(namespace, record, parent_run_id, op_id)
        except ApiException as exc:
            if is_transient(exc):
                raise StoreUnavailable(f"creating a child workflow of run {parent_run_id}: {brief(exc)}") from exc
            raise RuntimeError(
                f"The API server refused the child workflow {record.workflow!r} of run {parent_run_id} in namespace "
                f"{namespace} ({exc.status} {api_message(exc)}); the operator needs `create` on "
                f"workflows.durable-sandbox.dev there (the chart grants it)."
            ) from exc

    async def _create(self, namespace: str, record: RunRecord, parent_run_id: str, op_id: str) -> RunRecord:
        parent = await self._parent(namespace, parent_run_id)
        body = child_body(parent, namespace, parent_run_id, op_id, record, self._journal_key)
        name = body["metadata"]["name"]
        made = await self.objects.create(WORKFLOWS, namespace, body)
        if made is None:
            made = await self.objects.get(WORKFLOWS, namespace, name)
            why = ("it was deleted while being adopted" if made is None
                   else not_adoptable(made, parent.uid, record, op_id, self._journal_key))
            if why is not None:
                self._refused(parent_run_id, message := (
                    f"Workflow {namespace}/{name} exists but is not the child workflow {record.workflow!r} that "
                    f"run {parent_run_id} starts as {op_id!r}: {why}. It was not adopted; delete it "
                    f"(kubectl delete dwf {name} -n {namespace}) and the run creates its child when it is retried."
                ))
                raise ChildNotAdoptable(message)
        assert made is not None
        uid = str(made["metadata"]["uid"])
        run = replace(record, run_id=cluster_run_id(name, uid),
                      labels={**record.labels, PARENT_LABEL: parent_run_id, WORKFLOW_LABEL: name})
        stored, created = await self._store_for(namespace).create_run(run, owner=OwnerRef(name=name, uid=uid))
        if not created and (stored.workflow != run.workflow or stored.input != run.input):
            raise ChildNotAdoptable(f"the run of Workflow {namespace}/{name} is not the child's program")
        if stored.labels.get(PARENT_LABEL) != parent_run_id:
            # The child's own admission created its run first (it races this): the run learns its parent
            # here, from the parent's process, so that its end wakes the parent.
            labels = {**stored.labels, PARENT_LABEL: parent_run_id}
            await self._store_for(namespace).update_run(stored.run_id, {"labels": labels})
            stored = replace(stored, labels=labels)
        return stored

    def _refused(self, parent_run_id: str, message: str) -> None:
        """A Warning Event on the parent Workflow (when this replica serves it) saying what was refused and why."""
        view = self.runs.views.get(parent_run_id)
        if view is not None and self._emit is not None:
            self._emit(view.body, LifecycleEvent(REFUSED_REASON, message[:1024], "Warning"))

    async def _parent(self, namespace: str, run_id: str) -> OwnerRef:
        """The Workflow whose run ``run_id`` is: the one this replica serves, else the one its (sealed) run record
        names, if that object's run is this run (a child executed by its own parent's process)."""
        view = self.runs.views.get(run_id)
        if view is not None and view.namespace == namespace:
            return OwnerRef(name=view.name, uid=view.uid)
        run = await self._store_for(namespace).get_run(run_id)
        name = run.labels.get(WORKFLOW_LABEL) if run is not None else None
        body = await self.objects.get(WORKFLOWS, namespace, name) if name else None
        uid = str(((body or {}).get("metadata") or {}).get("uid") or "")
        if name is None or not uid or cluster_run_id(name, uid) != run_id:
            raise RuntimeError(f"run {run_id} starts a child workflow but no Workflow of namespace {namespace} "
                               f"is that run's (only a Workflow's run can start a child in the cluster)")
        return OwnerRef(name=name, uid=uid)
