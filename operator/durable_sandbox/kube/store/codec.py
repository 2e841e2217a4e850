"""The store's pure parts: object names from run ids, the record and run-field encodings, JSON Pointer escaping,
the sizes that decide where a value goes, and an object's metadata. No I/O here."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine.records import ErrorInfo, OperationRecord, RunStatus
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, LABEL_RUN, MANAGED_BY

LABEL_STATUS = "durable-sandbox.dev/status"
ANNOTATION_RUN = "durable-sandbox.dev/run-id"

# The journal kept in the head before it moves to a chunk. Every commit rewrites the head (the apiserver
# decodes, patches, encodes and stores the whole object), so its size is the cost of a commit: measured on
# the e2e control plane, 128 KiB gave ~27 commits/s, 32 KiB ~43/s, 8 KiB ~56/s (one loaded 2-core machine).
TAIL_BYTES = 32 * 1024
CHUNK_BYTES = 384 * 1024  # a chunk takes tails until it would pass this: well under the 1.5 MiB object limit
INLINE_RECORD_BYTES = 32 * 1024
INLINE_FIELD_BYTES = 16 * 1024
BLOB_PART_BYTES = 512 * 1024
EVENTS_BYTES = 256 * 1024

RUN_FIELDS = (
    "workflow", "status", "input", "result", "error", "thread_id", "created_at", "updated_at", "wake_at",
    "pending_callbacks", "cancel_requested", "epoch", "lease_owner", "labels", "workflow_ref",
)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
RETRIES = 20
TRANSIENT_RETRIES = 5  # a commit whose answer was lost, or that the API server failed (5xx, 429), is retried


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """The Workflow a run belongs to: its objects are owned by it and deleted with it."""

    name: str
    uid: str
    api_version: str = "durable-sandbox.dev/v1alpha1"
    kind: str = "Workflow"

    def to_json(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}


@dataclass
class RunState:
    """What this instance knows of a run's head (refreshed from the API whenever in doubt)."""

    name: str
    fence: int
    seq: int
    chunks: list[dict[str, Any]]
    tail: dict[int, int]  # seq -> bytes of the records in the head
    owners: list[dict[str, Any]] = field(default_factory=list)
    events_seq: int | None = None


def run_key(run_id: str) -> str:
    """The run's name part in object names and its label value: the id itself when it is a DNS label."""
    if _DNS_LABEL.fullmatch(run_id):
        return run_id
    return "x" + hashlib.sha256(run_id.encode()).hexdigest()[:40]


def head_name(run_id: str) -> str:
    return f"dsb.{run_key(run_id)}"


def lease_name(run_id: str) -> str:
    return f"dsb.{run_key(run_id)}.lease"


def side_name(kind: str, key: str) -> str:
    """The object of a thread's state or a cache entry (``kind``: ``thread`` or ``cache``)."""
    return f"dsb.{kind}.{hashlib.sha256(key.encode()).hexdigest()[:40]}"


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def jp(*parts: str) -> str:
    """A JSON Pointer to ``parts``, each escaped."""
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def seq_key(seq: int) -> str:
    return f"j.{seq:012d}"


def encode_record(r: OperationRecord) -> str:
    out: dict[str, Any] = {"op": r.op_id, "k": r.kind, "n": r.name, "s": r.status, "a": r.attempt, "t": r.ts}
    if r.input_digest is not None:
        out["d"] = r.input_digest
    if r.status == "completed":
        out["r"] = r.result
    if r.error is not None:
        out["e"] = r.error.to_json()
    if r.meta:
        out["m"] = r.meta
    if r.epoch:
        out["ep"] = r.epoch
    return dumps(out)


def decode_record(seq: int, text: str) -> OperationRecord:
    d = json.loads(text)
    return OperationRecord(
        op_id=d["op"], kind=d["k"], name=d["n"], status=d["s"], attempt=d["a"], input_digest=d.get("d"),
        result=d.get("r"), error=ErrorInfo.from_json(d["e"]) if "e" in d else None, meta=d.get("m"),
        ts=d["t"], epoch=d.get("ep", 0), seq=seq,
    )


def field_value(name: str, value: Any) -> Any:
    """A run field as stored (JSON-ready)."""
    if name == "status":
        return RunStatus(value).value
    if name == "error":
        return value.to_json() if value is not None else None
    return value


def object_meta(name: str, key: str | None, part: str, owners: list[dict[str, Any]],
                extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The metadata of a Journal object of part ``part`` (of run key ``key``, if any), owned by ``owners``."""
    labels = {**MANAGED_BY, LABEL_PART: part, **(extra_labels or {})}
    if key is not None:
        labels[LABEL_RUN] = key
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if owners:
        meta["ownerReferences"] = owners
    return meta


def run_id_of(head: dict[str, Any]) -> str:
    """The run id a head is of (its annotation; its label for heads written before it had one)."""
    meta = head["metadata"]
    return str((meta.get("annotations") or {}).get(ANNOTATION_RUN) or meta["labels"][LABEL_RUN])
