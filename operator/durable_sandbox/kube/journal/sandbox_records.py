"""The operator's own record of each Sandbox resource: what it made and what it may delete.

A Sandbox's status is written by the operator, but anyone granted ``sandboxes/status`` can write it too, so
status is only ever a projection: the live sandbox's id and handle, the snapshots the Sandbox owns, the
operation in progress (intent before effect) and the Workflow holding it are kept in a ``Journal`` object of
their own, ``dsbx.<uid>.state`` (part ``sandbox``, owned by the Sandbox), which no namespace role grants.
Every value is sealed (``kube/journal/sealing.py``), one data key per field, so the controller's writes (JSON Patch
``add``/``remove`` of the keys it changes) and a Workflow taking or letting go of the Sandbox (a
compare-and-swap of ``holder``) never overwrite each other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.kube.api.client import (
    ApiException,
    KubeClient,
    is_conflict,
    is_not_found,
    is_precondition_failed,
)
from durable_sandbox.kube.api.labels import label_value
from durable_sandbox.kube.api.resources import API_VERSION
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, MANAGED_BY, JournalObjects
from durable_sandbox.kube.journal.namespaced import NamespacedJournals
from durable_sandbox.kube.journal.sealing import Sealer

__all__ = ["ACTIVE_AT", "HOLDER", "IDLE_CLAIM", "IDLE_SUSPENDED", "LINEAGE", "RECORDED", "SNAPSHOT_AT", "SUSPENDED_AT",
           "SandboxRecords"]

SANDBOX_LABEL = "durable-sandbox.dev/sandbox"
HOLDER = "holder"
# The holder while the idle timer suspends the Sandbox (spec.idleSuspendAfterSeconds): taken with the same
# compare-and-swap as a Workflow takes it, so a Workflow's calls and an idle suspend never overlap. Parentheses
# are in no Kubernetes name, so no Workflow can be called this.
IDLE_CLAIM = "(idle-suspend)"
# When the Sandbox was last taken or let go by a Workflow, or made live (epoch seconds): the idle timer counts
# from it. Written by the operator only (Holding and the controller), never read from status.
ACTIVE_AT = "lastActiveAt"
IDLE_SUSPENDED = "idleSuspended"  # suspended by the idle timer (not spec.suspend): the next Workflow resumes it
SUSPENDED_AT = "suspendedAt"  # when the live sandbox was last suspended (epoch seconds; shown as status.stateSince)
# Where each recent sandbox and snapshot of the Sandbox came from: a sandbox id -> the snapshot it was restored
# from ("" when provisioned fresh), a snapshot id -> the sandbox it was taken of. The session calls
# (sessions/rebuild.py) read it to know which of their calls a replacement sandbox already holds.
LINEAGE = "lineage"
SNAPSHOT_AT = "snapshotAt"  # when the newest snapshot in "snapshots" was taken (epoch seconds)
# The fields of a Sandbox's status that the operator acts on: kept here, shown in status.
# "provider" pins the Sandbox's provider (kube/spec/provider_choice.py) before anything is provisioned.
RECORDED = ("provider", "providerId", "handle", "leaseExpiresAt", "snapshots", "operation", "operationCount", "phase",
            "capabilities", ACTIVE_AT, IDLE_SUSPENDED, SUSPENDED_AT, LINEAGE, SNAPSHOT_AT)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


class SandboxRecords:
    """The records of every Sandbox this operator serves (one ``JournalObjects`` per namespace)."""

    def __init__(self, api: KubeClient, journal_key: bytes | None, *, field_manager: str = "durable-sandbox-operator") -> None:
        self.api = api
        self._journals = NamespacedJournals(api, journal_key, field_manager)

    def _of(self, namespace: str) -> tuple[JournalObjects, Sealer]:
        return self._journals.of(namespace)

    @staticmethod
    def name(uid: str) -> str:
        return f"dsbx.{uid}.state"

    async def read(self, namespace: str, uid: str) -> dict[str, Any]:
        """The record of the Sandbox with ``uid`` (empty when there is none yet); :class:`JournalDamaged` when a
        value fails its seal or cannot be decoded."""
        objects, _ = self._of(namespace)
        body = await objects.get(self.name(uid))
        return self._decode(namespace, body) if body is not None else {}

    async def all(self, namespace: str) -> dict[str, dict[str, Any] | None]:
        """Every record of ``namespace`` by its Sandbox's uid (None for one that fails its seals)."""
        objects, _ = self._of(namespace)
        out: dict[str, dict[str, Any] | None] = {}
        for body in await objects.select(f"{LABEL_PART}=sandbox"):
            uid = body["metadata"]["name"].removeprefix("dsbx.").removesuffix(".state")
            try:
                out[uid] = self._decode(namespace, body)
            except JournalDamaged:
                out[uid] = None
        return out

    def _decode(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        _, sealer = self._of(namespace)
        name = body["metadata"]["name"]
        out: dict[str, Any] = {}
        for key, stored in (body.get("data") or {}).items():
            text = sealer.open(name, key, str(stored), run_id="", where=f"Journal {namespace}/{name}")
            try:
                out[key] = json.loads(text)
            except ValueError as exc:
                raise JournalDamaged("", f"Journal {namespace}/{name} key {key!r}", f"not JSON ({exc})",
                                     tampered=False) from None
        return {k: v for k, v in out.items() if v is not None}

    async def write(self, namespace: str, sandbox: str, uid: str, changes: Mapping[str, Any]) -> None:
        """Record ``changes`` (a value of None removes the field), creating the record on first use."""
        objects, sealer = self._of(namespace)
        name = self.name(uid)
        known = {k: v for k, v in changes.items() if k in RECORDED}
        if not known:
            return
        ops: list[dict[str, Any]] = [
            {"op": "add", "path": f"/data/{key}", "value": sealer.seal(name, key, _dumps(value))}
            for key, value in known.items()
        ]
        try:
            await objects.patch(name, ops)
            return
        except ApiException as exc:
            if not is_not_found(exc):
                raise
        data = {key: sealer.seal(name, key, _dumps(value)) for key, value in known.items()}
        data.setdefault(HOLDER, sealer.seal(name, HOLDER, _dumps(None)))
        meta = {"name": name, "labels": {**MANAGED_BY, LABEL_PART: "sandbox", SANDBOX_LABEL: label_value(sandbox)},
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": "Sandbox", "name": sandbox, "uid": uid}]}
        try:
            await objects.create(JournalObjects.body(meta, data, run=sandbox, part="sandbox"))
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            await objects.patch(name, ops)  # made meanwhile (a takeover racing us): add ours to it

    async def swap_holder(self, namespace: str, uid: str, expected: str | None, holder: str | None, *,
                          unchanged: Mapping[str, Any] | None = None, also: Mapping[str, Any] | None = None) -> bool:
        """Set ``holder`` only while it is ``expected`` and every field of ``unchanged`` still has its value there,
        recording ``also`` with it in the same patch; False when not (or there is no record yet)."""
        objects, sealer = self._of(namespace)
        name = self.name(uid)
        ops = [{"op": "test", "path": f"/data/{HOLDER}", "value": sealer.seal(name, HOLDER, _dumps(expected))}]
        ops += [{"op": "test", "path": f"/data/{key}", "value": sealer.seal(name, key, _dumps(value))}
                for key, value in (unchanged or {}).items()]
        ops.append({"op": "replace", "path": f"/data/{HOLDER}", "value": sealer.seal(name, HOLDER, _dumps(holder))})
        ops += [{"op": "add", "path": f"/data/{key}", "value": sealer.seal(name, key, _dumps(value))}
                for key, value in (also or {}).items()]
        try:
            await objects.patch(name, ops)
        except ApiException as exc:
            if is_precondition_failed(exc) or is_not_found(exc):
                return False
            raise
        return True
