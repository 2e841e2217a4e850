"""``KubernetesStore``: the engine's store kept in the API server of the cluster it runs in.

Objects of a run ``R`` (key ``K`` = ``R`` when ``R`` is a DNS label, else a digest of it), all of the kind
``Journal`` (``durable-sandbox.dev/v1alpha1``, shaped like a ConfigMap: a ``data`` map of strings; see
``kube/crds.py`` for why a kind of its own), labelled ``durable-sandbox.dev/run-id=K`` and
``durable-sandbox.dev/part=...``, owned by the Workflow when the run belongs to one (garbage-collected with it):

- ``dsb.K`` (part ``run``), the **head**: the run record (one data key per field, ``run.<field>``), the
  fencing token ``fence``, the last assigned ``seq``, the list of sealed ``chunks``, the ``signals``, and
  the journal **tail** (``j.<seq>`` keys). Everything one commit writes is in this one object, so a commit
  is one JSON Patch: ``test fence`` (+ ``test`` no cancel request, + ``test seq``), ``add`` the records,
  ``add`` the run fields: atomic, fenced, and one API write.
- ``dsb.K.j<first seq>`` (part ``journal``): journal chunks. When the tail passes ``TAIL_BYTES`` (32 KiB),
  the next commit first copies the tail into the current chunk (a new chunk once it would pass
  ``CHUNK_BYTES``, 384 KiB), then removes those keys from the head in the same fenced patch as its own
  records. The head's ``chunks`` list (name, first and last seq) is authoritative; copies are keyed by seq
  and idempotent (see ``_seal_tail``).
- ``dsb.K.b<digest>.<part>`` (part ``blob``): values too large to keep inline (a record over 32 KiB, a run
  field over 16 KiB: big stdout, results, a 10,000-call input), split into ≤ 512 KiB parts and referenced
  as ``@name,name`` from the record or field. Content-addressed, so writing one twice is harmless, and the
  content is checked against the digest in its name on every read.
- ``dsb.K.events`` (part ``events``): run events (lifecycle, progress), appended with a JSON Patch ``test``
  of their own counter; a bounded feed (the oldest are dropped past ``EVENTS_BYTES``).
- ``dsb.K.lease`` (part ``lease``): who executes the run (``kube/leases.py``); its transitions are the fence.

Cache entries (``dsb.cache.<digest>``) and thread state (``dsb.thread.<digest>``) have their own objects.
A commit carrying them writes them right after its head patch and records them in the head (``redo``) in
that same patch, so a worker that dies in between has them re-applied when the run is claimed next.

**Authenticated values.** With a journal key (the operator always has one, ``kube/journal_key.py``), every
value a run is executed or cleaned up from (records, run fields, signals, the chunk list, redo, thread state,
cache entries) is sealed (``kube/sealing.py``) and checked on every read; one that fails, or cannot be
decoded, raises :class:`~durable_sandbox.engine.errors.JournalDamaged`, never a replay of it.

API writes: a commit is one write (plus one chunk write per ~32 KiB of journal, plus a blob create per
large value); a claim is two (lease, head fence); renew and release one each. ``writes`` counts them.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import (
    JournalDamaged,
    LeaseHeld,
    LeaseLost,
    RunCancelledError,
    RunNotFound,
    SignalConflict,
    StoreRefused,
    StoreUnavailable,
)
from durable_sandbox.engine.records import (
    Commit,
    ErrorInfo,
    Event,
    Lease,
    OperationRecord,
    RunRecord,
    RunStatus,
)
from durable_sandbox.kube.client import (
    ApiException,
    KubeClient,
    is_conflict,
    is_not_found,
    is_precondition_failed,
    is_transient,
)
from durable_sandbox.kube.journal_objects import LABEL_PART, LABEL_RUN, MANAGED_BY, JournalObjects
from durable_sandbox.kube.leases import LeaseBusy, LeaseGone, Leases
from durable_sandbox.kube.sealing import Sealer

__all__ = ["KubernetesStore", "OwnerRef"]

log = logging.getLogger("durable_sandbox.kube.store")

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

_RUN_FIELDS = (
    "workflow", "status", "input", "result", "error", "thread_id", "created_at", "updated_at", "wake_at",
    "pending_callbacks", "cancel_requested", "epoch", "lease_owner", "labels", "workflow_ref",
)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_RETRIES = 20
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


def run_key(run_id: str) -> str:
    """The run's name part in object names and its label value: the id itself when it is a DNS label."""
    if _DNS_LABEL.fullmatch(run_id):
        return run_id
    return "x" + hashlib.sha256(run_id.encode()).hexdigest()[:40]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _jp(*parts: str) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _seq_key(seq: int) -> str:
    return f"j.{seq:012d}"


def _encode_record(r: OperationRecord) -> str:
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
    return _dumps(out)


def _decode_record(seq: int, text: str) -> OperationRecord:
    d = json.loads(text)
    return OperationRecord(
        op_id=d["op"], kind=d["k"], name=d["n"], status=d["s"], attempt=d["a"], input_digest=d.get("d"),
        result=d.get("r"), error=ErrorInfo.from_json(d["e"]) if "e" in d else None, meta=d.get("m"),
        ts=d["t"], epoch=d.get("ep", 0), seq=seq,
    )


def _field_value(name: str, value: Any) -> Any:
    if name == "status":
        return RunStatus(value).value
    if name == "error":
        return value.to_json() if value is not None else None
    return value


@dataclass
class _RunState:
    """What this instance knows of a run's head (refreshed from the API whenever in doubt)."""

    name: str
    fence: int
    seq: int
    chunks: list[dict[str, Any]]
    tail: dict[int, int]  # seq -> bytes of the records in the head
    owners: list[dict[str, Any]] = field(default_factory=list)
    events_seq: int | None = None


class KubernetesStore:
    """The Store protocol in one namespace. ``await KubernetesStore.connect(namespace)`` or give a client."""

    # Every events append is an API write (and a read): a run's events are written in batches at most
    # once per this many seconds (``RunRuntime`` reads it), not once per progress message.
    event_interval: float = 1.0

    def __init__(self, namespace: str, api: KubeClient, *, clock: Callable[[], float] = time.monotonic,
                 field_manager: str = "durable-sandbox", owns_client: bool = False,
                 journal_key: bytes | None = None) -> None:
        """``journal_key``: the operator's key (``kube/journal_key.py``); every value this store acts on is then
        sealed when written and checked when read. Without one (``dsb --kube`` reads with the user's own
        credentials) seals are stripped unchecked."""
        self.namespace = namespace
        self.api = api
        self.field_manager = field_manager
        self.sealer = Sealer(journal_key, namespace)
        self.objects = JournalObjects(api, namespace, field_manager=field_manager)
        self.leases = Leases(api, namespace, clock=clock, field_manager=field_manager)
        self._runs: dict[str, _RunState] = {}
        self._owns_client = owns_client

    @classmethod
    async def connect(cls, namespace: str, *, kubeconfig: str | None = None, **kw: Any) -> KubernetesStore:
        return cls(namespace, await KubeClient.connect(kubeconfig=kubeconfig), owns_client=True, **kw)

    def __repr__(self) -> str:
        return f"KubernetesStore(namespace={self.namespace!r})"

    async def close(self) -> None:
        if self._owns_client:
            await self.api.close()

    @property
    def writes(self) -> Counter[str]:
        """API writes by "verb kind", for the write budget."""
        return self.objects.writes

    @property
    def write_count(self) -> int:
        return sum(self.writes.values()) + self.leases.writes

    # ------------------------------------------------------------------ Journal objects (kube/journal_objects.py)

    async def _get(self, name: str) -> dict[str, Any] | None:
        return await self.objects.get(name)

    async def _list(self, selector: str) -> list[dict[str, Any]]:
        return await self.objects.select(selector)

    async def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.objects.create(JournalObjects.body(body["metadata"], body["data"]))

    async def _patch(self, name: str, ops: list[dict[str, Any]]) -> None:
        await self.objects.patch(name, ops)

    async def _delete(self, name: str, *, resource_version: str | None = None) -> bool:
        return await self.objects.delete(name, resource_version=resource_version)

    # ------------------------------------------------------------------ sealed values (kube/sealing.py)

    def _sealed(self, scope: str, name: str, value: str) -> str:
        return self.sealer.seal(scope, name, value)

    def _opened(self, run_id: str, scope: str, name: str, stored: str, where: str) -> str:
        return self.sealer.open(scope, name, stored, run_id=run_id, where=f"Journal {self.namespace}/{where}")

    def _loads(self, run_id: str, scope: str, data: dict[str, Any], name: str, where: str, default: str) -> Any:
        """The JSON value of ``data[name]``, opened and decoded; :class:`JournalDamaged` when it is not."""
        text = data.get(name)
        if text is None:
            return json.loads(default)
        opened = self._opened(run_id, scope, name, str(text), where)
        try:
            return json.loads(opened)
        except ValueError as exc:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{where} key {name!r}",
                                 f"not JSON ({exc})", tampered=False) from None

    def _meta(self, name: str, key: str | None, part: str, owners: list[dict[str, Any]],
              extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
        labels = {**MANAGED_BY, LABEL_PART: part, **(extra_labels or {})}
        if key is not None:
            labels[LABEL_RUN] = key
        meta: dict[str, Any] = {"name": name, "labels": labels}
        if owners:
            meta["ownerReferences"] = owners
        return meta

    # ------------------------------------------------------------------ blobs (values too large to inline)

    async def _put_value(self, key: str, text: str, limit: int, owners: list[dict[str, Any]]) -> str:
        """``text`` itself if small, else stored in blob objects and returned as ``@name,name``."""
        if len(text.encode()) <= limit:
            return text
        ascii_text = json.dumps(json.loads(text), separators=(",", ":"))  # 1 char = 1 byte: exact parts
        digest = hashlib.sha256(ascii_text.encode()).hexdigest()[:20]
        parts = [ascii_text[i:i + BLOB_PART_BYTES] for i in range(0, len(ascii_text), BLOB_PART_BYTES)]
        names = [f"dsb.{key}.b{digest}.{i}" for i in range(len(parts))]

        async def put(name: str, part: str) -> None:
            try:
                await self._create({"metadata": self._meta(name, key, "blob", owners), "data": {"v": part}})
            except ApiException as exc:
                if not is_conflict(exc):  # content-addressed: an existing blob holds the same bytes
                    raise

        await asyncio.gather(*(put(n, p) for n, p in zip(names, parts, strict=True)))
        return "@" + ",".join(names)

    async def _value(self, run_id: str, text: str, where: str) -> str:
        """``text`` itself, or the content of the blobs it references, checked against their digest."""
        if not text.startswith("@"):
            return text
        names = text[1:].split(",")
        blobs = await asyncio.gather(*(self._get(n) for n in names))
        missing = [n for n, b in zip(names, blobs, strict=True) if b is None]
        if missing:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{where}",
                                 f"the value object(s) {missing} it references are missing", tampered=False)
        content = "".join(str((b.get("data") or {}).get("v", "")) for b in blobs if b is not None)
        digest = names[0].rsplit(".", 2)[-2][1:]  # dsb.<key>.b<digest>.<part>
        if hashlib.sha256(content.encode()).hexdigest()[:20] != digest:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{names[0]}",
                                 "the value's content does not match the digest in its name", tampered=True)
        return content

    # ------------------------------------------------------------------ runs

    def _state_from_head(self, run_id: str, head: dict[str, Any]) -> _RunState:
        data = head.get("data") or {}
        name = head["metadata"]["name"]
        tail = {int(k[2:]): len(v.encode()) for k, v in data.items() if k.startswith("j.")}
        try:
            fence, seq = int(data.get("fence", "0")), int(data.get("seq", "0"))
        except ValueError:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{name}", "fence or seq is not a number",
                                 tampered=False) from None
        st = _RunState(
            name=name, fence=fence, seq=seq, chunks=self._loads(run_id, run_key(run_id), data, "chunks", name, "[]"),
            tail=tail, owners=list(head["metadata"].get("ownerReferences") or []),
        )
        old = self._runs.get(run_id)
        if old is not None:
            st.events_seq = old.events_seq
        self._runs[run_id] = st
        return st

    async def _head(self, run_id: str) -> dict[str, Any] | None:
        head = await self._get(f"dsb.{run_key(run_id)}")
        if head is not None:
            self._state_from_head(run_id, head)
        return head

    @staticmethod
    def _run_id_of(head: dict[str, Any]) -> str:
        meta = head["metadata"]
        return str((meta.get("annotations") or {}).get(ANNOTATION_RUN) or meta["labels"][LABEL_RUN])

    async def _field(self, run_id: str, data: dict[str, Any], name: str, where: str) -> Any:
        """A run field of a head: opened, its blobs resolved, decoded."""
        key = f"run.{name}"
        text = data.get(key)
        if text is None:
            return None
        value = await self._value(run_id, self._opened(run_id, run_key(run_id), key, str(text), where), where)
        try:
            return json.loads(value)
        except ValueError as exc:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{where} key {key!r}", f"not JSON ({exc})",
                                 tampered=False) from None

    async def _run_from_head(self, head: dict[str, Any]) -> RunRecord:
        data = head.get("data") or {}
        run_id, where = self._run_id_of(head), head["metadata"]["name"]
        texts = [await self._field(run_id, data, f, where) for f in _RUN_FIELDS]  # blobs are rare: no gather
        values = dict(zip(_RUN_FIELDS, texts, strict=True))
        try:
            return RunRecord(
                run_id=run_id, workflow=values["workflow"], status=RunStatus(values["status"]), input=values["input"],
                result=values["result"],
                error=ErrorInfo.from_json(values["error"]) if values["error"] else None,
                thread_id=values["thread_id"], created_at=values["created_at"], updated_at=values["updated_at"],
                wake_at=values["wake_at"], pending_callbacks=values["pending_callbacks"] or [],
                cancel_requested=values["cancel_requested"], epoch=values["epoch"] or 0,
                lease_owner=values["lease_owner"], fence=int(data.get("fence", "0")), labels=values["labels"] or {},
                workflow_ref=values["workflow_ref"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{where}",
                                 f"the run record cannot be decoded ({type(exc).__name__}: {exc})",
                                 tampered=False) from None

    async def create_run(self, run: RunRecord, *, owner: OwnerRef | None = None) -> tuple[RunRecord, bool]:
        """Insert ``run`` unless its id exists. ``owner``: the Workflow whose deletion deletes the run."""
        key = run_key(run.run_id)
        existing = await self._head(run.run_id)
        if existing is not None:  # the common case (every admission of a run that exists): one GET
            return await self._run_from_head(existing), False
        owners = [owner.to_json()] if owner else []
        data: dict[str, str] = {"fence": "0", "seq": "0", "chunks": self._sealed(key, "chunks", "[]"),
                                "signals": self._sealed(key, "signals", "{}")}
        for f in _RUN_FIELDS:
            value = _field_value(f, getattr(run, f))
            stored = await self._put_value(key, _dumps(value), INLINE_FIELD_BYTES, owners)
            data[f"run.{f}"] = self._sealed(key, f"run.{f}", stored)
        meta = self._meta(f"dsb.{key}", key, "run", owners, {LABEL_STATUS: run.status.value})
        meta["annotations"] = {ANNOTATION_RUN: run.run_id}
        lease = await self.leases.read(self._lease_name(run.run_id))
        if lease is not None:
            # Its lease outlives the head only if the head was deleted behind the store's back (they go together
            # otherwise): the run ran, and starting it afresh would execute every committed call again.
            raise JournalDamaged(
                run.run_id, f"Journal {self.namespace}/dsb.{key}",
                f"the run's head is missing while its lease {lease.name} shows it was executed "
                f"({lease.transitions} claim(s))", tampered=False, lost=True)
        try:
            head = await self._create({"metadata": meta, "data": data})
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            existing = await self._head(run.run_id)
            if existing is None:  # deleted in between: try once more
                return await self.create_run(run, owner=owner)
            return await self._run_from_head(existing), False
        self._state_from_head(run.run_id, head)
        return run, True

    async def get_run(self, run_id: str) -> RunRecord | None:
        head = await self._head(run_id)
        return None if head is None else await self._run_from_head(head)

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        selector = f"{LABEL_PART}=run"
        if status:
            selector += f",{LABEL_STATUS} in ({','.join(RunStatus(s).value for s in status)})"
        heads = await self._list(selector)
        if workflow is not None:
            heads = [h for h in heads
                     if await self._field(self._run_id_of(h), h.get("data") or {}, "workflow",
                                          h["metadata"]["name"]) == workflow]
        runs = await asyncio.gather(*(self._run_from_head(h) for h in heads))
        return sorted(runs, key=lambda r: r.created_at, reverse=True)[:limit]

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        """Delete the head first (the run disappears for every reader at once, conditional on the version
        whose fence we checked), then the run's other objects by label. Its events object goes before the
        head, so a run created again under the same id never inherits old events; leftovers of a crash in
        between (chunks, blobs) are never read: a new head lists no chunks."""
        key = run_key(run_id)
        name = f"dsb.{key}"
        for _ in range(_RETRIES):
            head = await self._get(name)
            if head is None:
                return False
            if fence is not None and int((head.get("data") or {}).get("fence", "0")) != fence:
                raise LeaseLost(run_id, fence)
            await self._delete(f"{name}.events")
            try:
                if not await self._delete(name, resource_version=head["metadata"]["resourceVersion"]):
                    return False
            except ApiException as exc:
                if is_conflict(exc):
                    continue  # written since we checked the fence: check again
                raise
            break
        else:
            raise RuntimeError(f"Could not delete run {run_id!r}: its head kept changing")
        self._runs.pop(run_id, None)
        await self.objects.delete_all(f"{LABEL_RUN}={key}")  # chunks, blobs and the run's lease
        return True

    async def _field_ops(self, run_id: str, changes: dict[str, Any], owners: list[dict[str, Any]]) -> list[dict[str, Any]]:
        key = run_key(run_id)
        ops: list[dict[str, Any]] = []
        for name, value in {**changes, "updated_at": time.time()}.items():
            if name not in _RUN_FIELDS:
                raise ValueError(f"{name!r} is not a run field a store can change (known: {', '.join(_RUN_FIELDS)})")
            encoded = await self._put_value(key, _dumps(_field_value(name, value)), INLINE_FIELD_BYTES, owners)
            ops.append({"op": "add", "path": _jp("data", f"run.{name}"),
                        "value": self._sealed(key, f"run.{name}", encoded)})
            if name == "status":
                ops.append({"op": "add", "path": _jp("metadata", "labels", LABEL_STATUS),
                            "value": RunStatus(value).value})
        return ops

    async def _owners(self, run_id: str) -> list[dict[str, Any]]:
        """The run's owner references (for objects it creates), read from its head once per instance."""
        st = self._runs.get(run_id)
        if st is None and await self._head(run_id) is not None:
            st = self._runs[run_id]
        return st.owners if st is not None else []

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        owners = await self._owners(run_id)
        ops = await self._field_ops(run_id, changes, owners)
        if fence is not None:
            ops.insert(0, {"op": "test", "path": "/data/fence", "value": str(fence)})
        try:
            await self._patch(f"dsb.{run_key(run_id)}", ops)
        except ApiException as exc:
            if is_not_found(exc):
                if fence is not None:
                    raise LeaseLost(run_id, fence) from None
                raise RunNotFound(run_id) from None
            if fence is not None and is_precondition_failed(exc):
                await self._head(run_id)
                raise LeaseLost(run_id, fence) from None
            raise

    # ------------------------------------------------------------------ journal

    async def _fenced_state(self, run_id: str, fence: int, *, refresh: bool = False) -> _RunState:
        st = self._runs.get(run_id)
        if refresh or st is None or st.fence != fence:
            if await self._head(run_id) is None:
                raise LeaseLost(run_id, fence)
            st = self._runs[run_id]
        if st.fence != fence:
            raise LeaseLost(run_id, fence)
        return st

    # Long on purpose: one fenced commit as one JSON patch (test fence, records, chunk rollover) with its
    # retries; the uncertain-outcome bookkeeping must see every attempt, so the loop stays whole.
    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        key = run_key(run_id)
        refresh = False
        uncertain = 0  # attempts whose outcome we do not know (the answer was lost or the server failed)
        for _ in range(3 + TRANSIENT_RETRIES):
            st = await self._fenced_state(run_id, fence, refresh=refresh)
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/data/fence", "value": str(fence)}]
            if commit.check_cancel:
                ops.append({"op": "test", "path": "/data/run.cancel_requested",
                            "value": self._sealed(key, "run.cancel_requested", "null")})
            ops.append({"op": "test", "path": "/data/seq", "value": str(st.seq)})
            encoded: list[str] = []
            for r in commit.records:
                encoded.append(await self._put_value(key, _encode_record(r), INLINE_RECORD_BYTES, st.owners))
            new_bytes = sum(len(e.encode()) for e in encoded)
            sealed: tuple[list[dict[str, Any]], list[int]] | None = None
            if st.tail and sum(st.tail.values()) + new_bytes > TAIL_BYTES:
                sealed = await self._seal_tail(run_id, st, fence, ops)
            first, seq = st.seq + 1, st.seq
            stored: list[str] = []
            for text in encoded:
                seq += 1
                stored.append(self._sealed(key, _seq_key(seq), text))
                ops.append({"op": "add", "path": _jp("data", _seq_key(seq)), "value": stored[-1]})
            if commit.records:
                ops.append({"op": "replace", "path": "/data/seq", "value": str(seq)})
            if commit.run:
                ops.extend(await self._field_ops(run_id, commit.run, st.owners))
            redo = self._redo(run_id, fence, seq, commit)
            if redo is not None:
                ops.append({"op": "add", "path": "/data/redo", "value": self._sealed(key, "redo", _dumps(redo))})
            try:
                await self._patch(st.name, ops)
            except Exception as exc:
                if is_not_found(exc):
                    raise LeaseLost(run_id, fence) from None
                if is_transient(exc) and uncertain >= TRANSIENT_RETRIES:
                    # The API server stayed away (a restart): not a failure of the run; the worker stops
                    # and the run resumes from its journal once claimed again.
                    raise StoreUnavailable(f"{type(exc).__name__}: {exc}", run_id) from exc
                if is_transient(exc):
                    # It may or may not have landed. Only the holder of `fence` moves `seq`, so the head
                    # tells: seq at our last record = it landed; unchanged = it did not (send it again).
                    uncertain += 1
                    await asyncio.sleep(0.2 * 2**uncertain)
                    try:
                        head = await self._head_retrying(run_id)
                    except Exception as err:
                        if is_transient(err):
                            raise StoreUnavailable(f"{type(err).__name__}: {err}", run_id) from err
                        raise
                    if head is None or self._runs[run_id].fence != fence:
                        raise LeaseLost(run_id, fence) from None
                    if commit.records and self._runs[run_id].seq == seq:
                        st = self._runs[run_id]
                        for r, s in zip(commit.records, range(first, seq + 1), strict=True):
                            r.seq = s
                        break
                    refresh = True
                    continue
                if not is_precondition_failed(exc):
                    raise
                head = await self._head(run_id)
                if head is None or self._runs[run_id].fence != fence:
                    raise LeaseLost(run_id, fence) from None
                cancel = await self._field(run_id, head.get("data") or {}, "cancel_requested", st.name)
                if commit.check_cancel and cancel is not None:
                    raise RunCancelledError(run_id, cancel) from None
                refresh = True  # our idea of seq or the tail was stale: try again from the head
                continue
            for r, text, s in zip(commit.records, stored, range(first, seq + 1), strict=True):
                r.seq = s
                st.tail[s] = len(text.encode())
            if sealed is not None:
                st.chunks = sealed[0]
                for s in sealed[1]:
                    st.tail.pop(s, None)
            st.seq = seq
            break
        else:
            raise RuntimeError(
                f"Could not append to the journal of run {run_id!r} in namespace {self.namespace!r}: the head "
                f"kept changing under a valid fence, or the API server kept failing; the worker stops here and "
                f"the run resumes from its journal when claimed again."
            )
        if redo is not None:
            faults.reach("kube.store.before_side_writes")  # crash tests: the head has the redo, nothing else
            try:
                await self._apply_redo(redo)
            except ApiException as exc:
                if exc.status not in REFUSALS:
                    raise
                # The commit landed (the head has its records and the redo): raised as a refusal, it would be
                # offered again by a run held at it (engine/refusals.py) and its records written twice. The next
                # claim of the run applies the redo from the head.
                log.warning("Journal %s/%s: writing run %s's thread state or cache entry was refused (%s %s); "
                            "the next claim of the run writes it", self.namespace, st.name, run_id, exc.status,
                            _api_message(exc))

    async def _head_retrying(self, run_id: str) -> dict[str, Any] | None:
        for attempt in range(TRANSIENT_RETRIES):
            try:
                return await self._head(run_id)
            except Exception as exc:
                if not is_transient(exc) or attempt == TRANSIENT_RETRIES - 1:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        return None  # pragma: no cover - the loop returns or raises

    async def _seal_tail(self, run_id: str, st: _RunState, fence: int,
                    ops: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
        """Move the head's tail into the current chunk (a new one once it would pass ``CHUNK_BYTES``); add
        the head ops that drop the tail and list the chunk. Returns (new chunk list, sealed seqs).

        Chunk data is keyed by seq and every record was committed in the head before it is copied, so a
        copy is idempotent: if the head patch that should follow fails (this worker lost its lease), the
        chunk merely holds records that are still in the head, with the same content, and readers merge
        by seq. A chunk's ``last`` in the head's list is what counts."""
        key = run_key(run_id)
        head = await self._get(st.name)
        if head is None:
            raise LeaseLost(run_id, fence)
        data = head.get("data") or {}
        tail = {k: v for k, v in data.items() if k.startswith("j.")}
        seqs = sorted(int(k[2:]) for k in tail)
        size = sum(len(v.encode()) for v in tail.values())
        chunks = [dict(c) for c in self._loads(run_id, key, data, "chunks", st.name, "[]")]
        current = chunks[-1] if chunks and chunks[-1].get("bytes", CHUNK_BYTES) + size <= CHUNK_BYTES else None
        if current is not None:
            adds = [{"op": "add", "path": _jp("data", k), "value": v} for k, v in sorted(tail.items())]
            await self._patch(current["name"], adds)  # a missing chunk is an error (404), never recreated
            current["last"], current["bytes"] = seqs[-1], current["bytes"] + size
        else:
            name = f"dsb.{key}.j{seqs[0]:012d}"
            try:
                await self._create({"metadata": self._meta(name, key, "journal", st.owners), "data": tail})
            except ApiException as exc:
                if not is_conflict(exc):
                    raise
                # Left by an attempt whose head patch failed: the same records by seq; add ours to it.
                await self._patch(name, [{"op": "add", "path": _jp("data", k), "value": v}
                                         for k, v in sorted(tail.items())])
            chunks.append({"name": name, "first": seqs[0], "last": seqs[-1], "bytes": size})
        ops.extend({"op": "remove", "path": _jp("data", k)} for k in sorted(tail))
        ops.append({"op": "add", "path": "/data/chunks", "value": self._sealed(key, "chunks", _dumps(chunks))})
        return chunks, seqs

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self.journal_since(run_id, 0)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        head = await self._head(run_id)
        if head is None:
            return []
        key, name = run_key(run_id), head["metadata"]["name"]
        data = head.get("data") or {}
        st = self._runs[run_id]
        chunks = [c for c in st.chunks if c["last"] > after_seq]
        bodies = await asyncio.gather(*(self._get(c["name"]) for c in chunks))
        items: dict[int, tuple[str, str]] = {}  # seq -> (the object it was read from, its stored text)
        for c, body in zip(chunks, bodies, strict=True):
            if body is None:
                raise JournalDamaged(run_id, f"Journal {self.namespace}/{c['name']}",
                                     "this journal chunk, which the run's head lists, is missing", tampered=False)
            items.update((seq, (c["name"], v)) for k, v in (body.get("data") or {}).items()
                         if k.startswith("j.") and c["first"] <= (seq := int(k[2:])) <= c["last"])
        items.update((int(k[2:]), (name, v)) for k, v in data.items() if k.startswith("j."))
        seqs = list(range(after_seq + 1, st.seq + 1))
        missing = [s for s in seqs if s not in items]
        if missing:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{name}",
                                 f"records {missing[:5]} of 1..{st.seq} are missing", tampered=False)
        opened = [self._opened(run_id, key, _seq_key(s), items[s][1], items[s][0]) for s in seqs]
        texts = await asyncio.gather(*(self._value(run_id, t, items[s][0]) for s, t in zip(seqs, opened, strict=True)))
        out = []
        for s, text in zip(seqs, texts, strict=True):
            try:
                out.append(_decode_record(s, text))
            except (KeyError, TypeError, ValueError) as exc:
                raise JournalDamaged(run_id, f"Journal {self.namespace}/{items[s][0]} key {_seq_key(s)!r}",
                                     f"the record cannot be decoded ({type(exc).__name__}: {exc})",
                                     tampered=False) from None
        return out

    def forget(self, run_id: str) -> None:
        """Drop this instance's bookkeeping of a run's head (the operator parks a waiting run with nothing of
        it in memory); the next call that needs it reads the head again."""
        self._runs.pop(run_id, None)

    def journal_objects(self, run_id: str) -> list[str]:
        """Names of the run's sealed journal chunks as this instance last saw them (for ``status.journal``)."""
        st = self._runs.get(run_id)
        return [c["name"] for c in st.chunks] if st is not None else []

    # ------------------------------------------------------------------ thread state and cache (side objects)

    @staticmethod
    def _redo(run_id: str, fence: int, seq: int, commit: Commit) -> dict[str, Any] | None:
        if commit.thread_state is None and commit.cache is None:
            return None
        redo: dict[str, Any] = {"writer": f"{run_id}:{fence}:{seq}:{time.time()}"}
        if commit.thread_state is not None:
            redo["thread"] = list(commit.thread_state)
        if commit.cache is not None:
            redo["cache"] = list(commit.cache)
        return redo

    async def _apply_redo(self, redo: dict[str, Any], *, only_if_ours: bool = False) -> None:
        """Write a commit's thread state and cache entry to their objects (idempotent: a full replace)."""
        writer: str = redo["writer"]
        run_id = writer.rsplit(":", 3)[0]
        writes: list[tuple[str, str, dict[str, str], Any]] = []
        if "thread" in redo:
            tid, state = redo["thread"]
            writes.append((self._side_name("thread", tid), "thread", {"thread": _dumps(tid)}, state))
        if "cache" in redo:
            ckey, value, expires = redo["cache"]
            writes.append((self._side_name("cache", ckey), "cache",
                           {"key": _dumps(ckey), "createdAt": _dumps(time.time()), "expiresAt": _dumps(expires)},
                           value))
        for name, part, data, value in writes:
            if only_if_ours:
                current = await self._get(name)
                if current is not None:
                    was = self._side(current, "writer", "")
                    if was == writer or was.rsplit(":", 3)[0] != run_id:
                        continue  # applied already, or another run wrote since: that write is newer
            digest = name.rsplit(".", 1)[1]
            data["writer"] = _dumps(writer)
            data["value"] = await self._put_value(digest, _dumps(value), INLINE_FIELD_BYTES, [])
            body = {"metadata": self._meta(name, None, part, []),
                    "data": {k: self._sealed(name, k, v) for k, v in data.items()}}
            await self._upsert(name, body)

    async def _upsert(self, name: str, body: dict[str, Any]) -> None:
        """Create ``name`` or overwrite its data. A merge patch: a custom object cannot be replaced without
        the resourceVersion it was read at, and these writes are last-writer-wins by design."""
        for _ in range(_RETRIES):
            try:
                await self.objects.merge(name, body["data"])
                return
            except ApiException as exc:
                if not is_not_found(exc):
                    raise
            try:
                await self._create(body)
                return
            except ApiException as exc:
                if not is_conflict(exc):
                    raise
        raise RuntimeError(f"Could not write Journal {self.namespace}/{name}: it kept being created and deleted")

    def _side(self, obj: dict[str, Any], key: str, default: Any) -> Any:
        """A value of a thread-state or cache object, opened and decoded."""
        name = obj["metadata"]["name"]
        return self._loads("", name, obj.get("data") or {}, key, name, _dumps(default))

    @staticmethod
    def _side_name(kind: str, key: str) -> str:
        return f"dsb.{kind}.{hashlib.sha256(key.encode()).hexdigest()[:40]}"

    async def _side_value(self, obj: dict[str, Any]) -> Any:
        name = obj["metadata"]["name"]
        stored = (obj.get("data") or {}).get("value")
        if stored is None:
            return None
        text = await self._value("", self._opened("", name, "value", str(stored), name), name)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise JournalDamaged("", f"Journal {self.namespace}/{name} key 'value'", f"not JSON ({exc})",
                                 tampered=False) from None

    async def get_thread_state(self, thread_id: str) -> Any:
        obj = await self._get(self._side_name("thread", thread_id))
        return None if obj is None else await self._side_value(obj)

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        obj = await self._get(self._side_name("cache", key))
        if obj is None:
            return None
        expires = self._side(obj, "expiresAt", None)
        if expires is not None and expires <= now:
            return None
        return await self._side_value(obj), float(self._side(obj, "createdAt", 0.0))

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        if key is not None:
            return int(await self._delete(self._side_name("cache", key)))
        entries = await self._list(f"{LABEL_PART}=cache")
        doomed = [e["metadata"]["name"] for e in entries
                  if prefix is None or str(self._side(e, "key", "")).startswith(prefix)]
        deleted = await asyncio.gather(*(self._delete(n) for n in doomed))
        return sum(deleted)

    # ------------------------------------------------------------------ leases

    @staticmethod
    def _lease_name(run_id: str) -> str:
        return f"dsb.{run_key(run_id)}.lease"

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        head = await self._head(run_id)
        if head is None:
            raise RunNotFound(run_id)
        st = self._runs[run_id]
        key = run_key(run_id)
        try:
            fence = await self.leases.acquire(
                self._lease_name(run_id), owner, ttl, floor=st.fence, take_over_from=take_over_from,
                labels={**MANAGED_BY, LABEL_RUN: key, LABEL_PART: "lease"}, owners=st.owners, run=run_id,
            )
        except LeaseBusy as busy:
            raise LeaseHeld(run_id, busy.holder, time.time() + busy.remaining) from None
        # The lease is ours at `fence`: move the head's fence to it, so older holders can no longer write.
        for _ in range(_RETRIES):
            if st.fence >= fence:  # a newer claim already moved it: we lost the race after all
                holder = await self._field(run_id, head.get("data") or {}, "lease_owner", st.name)
                raise LeaseHeld(run_id, holder or "?", time.time() + ttl)
            ops = [
                {"op": "test", "path": "/data/fence", "value": str(st.fence)},
                {"op": "replace", "path": "/data/fence", "value": str(fence)},
                {"op": "add", "path": "/data/run.lease_owner", "value": self._sealed(key, "run.lease_owner", _dumps(owner))},
            ]
            try:
                await self._patch(st.name, ops)
            except ApiException as exc:
                if is_not_found(exc):
                    raise RunNotFound(run_id) from None
                if not is_precondition_failed(exc):
                    raise
                head = await self._head(run_id)
                if head is None:
                    raise RunNotFound(run_id) from None
                st = self._runs[run_id]
                continue
            st.fence = fence
            break
        else:
            raise LeaseHeld(run_id, "?", time.time() + ttl)
        redo = self._loads(run_id, key, head.get("data") or {}, "redo", st.name, "null")
        if redo:
            await self._apply_redo(redo, only_if_ours=True)
        return Lease(run_id, owner, fence, time.time() + ttl)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        try:
            await self.leases.renew(self._lease_name(lease.run_id), lease.owner, lease.fence, ttl)
        except LeaseGone:
            raise LeaseLost(lease.run_id, lease.fence) from None
        return Lease(lease.run_id, lease.owner, lease.fence, time.time() + ttl)

    async def release(self, lease: Lease) -> None:
        await self.leases.release(self._lease_name(lease.run_id), lease.owner, lease.fence)

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None) -> Lease | None:
        selector = f"{LABEL_PART}=run,{LABEL_STATUS} in (pending,waiting,running,suspended)"
        heads, leases = await asyncio.gather(self._list(selector), self.leases.list(f"{LABEL_PART}=lease"))
        now = time.time()
        candidates: list[tuple[float, str]] = []
        for head in heads:
            run_id, where = self._run_id_of(head), head["metadata"]["name"]
            data = head.get("data") or {}
            try:
                status, wake_at, cancel, workflow, updated_at = [
                    await self._field(run_id, data, f, where)
                    for f in ("status", "wake_at", "cancel_requested", "workflow", "updated_at")]
            except JournalDamaged as exc:
                log.warning("%s", exc)  # never handed out; the other runs go on
                continue
            runnable = (
                status in ("pending", "running")
                or (status == "waiting" and wake_at is not None and wake_at <= now)
                or (cancel is not None and status in ("waiting", "suspended"))
            )
            if not runnable:
                continue
            if workflows and workflow not in workflows:
                continue
            lease = leases.get(self._lease_name(run_id))
            if lease is not None and not self.leases.vacant(lease):
                continue  # held, by another worker or by this one: not ours to hand out again
            candidates.append((float(updated_at or 0), run_id))
        for _, run_id in sorted(candidates):
            try:
                return await self.claim(run_id, owner, ttl)
            except (LeaseHeld, RunNotFound):
                continue  # another replica was faster, or the run is gone
        return None

    # ------------------------------------------------------------------ signals

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        key = run_key(run_id)
        for _ in range(_RETRIES):
            head = await self._get(f"dsb.{key}")
            if head is None:
                raise RunNotFound(run_id)
            current = (head.get("data") or {}).get("signals")
            signals = dict(self._loads(run_id, key, head.get("data") or {}, "signals", head["metadata"]["name"], "{}"))
            if callback_id in signals:
                if _canonical(signals[callback_id]) == _canonical(value):
                    return False
                raise SignalConflict(run_id, callback_id)
            signals[callback_id] = value
            ops = [{"op": "test", "path": "/data/signals", "value": current} if current is not None
                   else {"op": "add", "path": "/data/signals", "value": self._sealed(key, "signals", "{}")},
                   {"op": "replace", "path": "/data/signals", "value": self._sealed(key, "signals", _dumps(signals))}]
            try:
                await self._patch(head["metadata"]["name"], ops)
            except ApiException as exc:
                if is_precondition_failed(exc):
                    continue  # another signal landed first: read again
                if is_not_found(exc):
                    raise RunNotFound(run_id) from None
                raise
            return True
        raise RuntimeError(f"Could not store signal {callback_id!r} of run {run_id!r}: too many concurrent signals")

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        key = run_key(run_id)
        head = await self._get(f"dsb.{key}")
        if head is None:
            return {}
        return dict(self._loads(run_id, key, head.get("data") or {}, "signals", head["metadata"]["name"], "{}"))

    # ------------------------------------------------------------------ events

    async def append_events(self, events: Sequence[Event]) -> None:
        by_run: dict[str, list[Event]] = {}
        for e in events:
            by_run.setdefault(e.run_id, []).append(e)
        await asyncio.gather(*(self._append_run_events(run_id, evs) for run_id, evs in by_run.items()))

    async def _append_run_events(self, run_id: str, events: list[Event]) -> None:
        key = run_key(run_id)
        name = f"dsb.{key}.events"
        for _ in range(_RETRIES):
            obj = await self._get(name)
            if obj is None:
                owners = await self._owners(run_id)  # so the events go with the Workflow too
                data = {"seq": str(len(events))}
                for i, e in enumerate(events, 1):
                    e.seq = i
                    data[f"e.{i:012d}"] = _dumps({"t": e.type, "d": e.data, "ts": e.ts})
                try:
                    await self._create({"metadata": self._meta(name, key, "events", owners), "data": data})
                except ApiException as exc:
                    if is_conflict(exc):
                        continue
                    raise
                return
            data = obj.get("data") or {}
            seq = int(data.get("seq", "0"))
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/data/seq", "value": str(seq)}]
            size = sum(len(v) for k, v in data.items() if k.startswith("e."))
            assigned = []
            for e in events:
                seq += 1
                text = _dumps({"t": e.type, "d": e.data, "ts": e.ts})
                size += len(text)
                ops.append({"op": "add", "path": _jp("data", f"e.{seq:012d}"), "value": text})
                assigned.append(seq)
            for k in sorted(k for k in data if k.startswith("e.")):  # bounded: drop the oldest
                if size <= EVENTS_BYTES:
                    break
                size -= len(data[k])
                ops.append({"op": "remove", "path": _jp("data", k)})
            ops.append({"op": "replace", "path": "/data/seq", "value": str(seq)})
            try:
                await self._patch(name, ops)
            except ApiException as exc:
                if is_precondition_failed(exc) or is_not_found(exc):
                    continue
                raise
            for e, s in zip(events, assigned, strict=True):
                e.seq = s
            return
        raise RuntimeError(f"Could not append events of run {run_id!r}: too many concurrent writers")

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        obj = await self._get(f"dsb.{run_key(run_id)}.events")
        if obj is None:
            return []
        data = obj.get("data") or {}
        seqs = sorted(int(k[2:]) for k in data if k.startswith("e."))
        out = []
        for s in seqs:
            if s <= after:
                continue
            d = json.loads(data[f"e.{s:012d}"])
            out.append(Event(run_id, d["t"], d["d"], d["ts"], s))
            if len(out) >= limit:
                break
        return out


def _unavailable_when_unreachable(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A store method whose API server cannot be reached (after the retries inside it) raises
    StoreUnavailable, which every caller handles as a lost lease, never as a failure of the run."""

    @functools.wraps(method)
    async def wrapper(self: KubernetesStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except Exception as exc:
            if is_transient(exc):
                raise StoreUnavailable(f"{method.__name__}: {type(exc).__name__}: {exc}") from exc
            if isinstance(exc, ApiException) and exc.status in REFUSALS:
                raise StoreRefused(
                    f"The API server refused to write the journal in namespace {self.namespace!r} ({method.__name__}: "
                    f"{exc.status} {_api_message(exc)}); the run stops here and goes on from its journal once that "
                    f"is fixed (a ResourceQuota on journals.durable-sandbox.dev, the operator's RBAC, a size limit)."
                ) from exc
            raise

    return wrapper


# Answers that say the write will not be taken as it is (others are retried inside the store, or transient).
REFUSALS = frozenset({400, 403, 413, 422})


def _api_message(exc: ApiException) -> str:
    """The API server's own message (a Status object's), short; never a request body."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        message = str(exc.reason)
    return message[:300]


# The store protocol (engine/store.py), as the engine and the operator call it.
for _name in ("create_run", "get_run", "list_runs", "delete_run", "update_run", "commit", "load_journal",
              "journal_since", "get_thread_state", "cache_get", "cache_clear", "claim", "renew", "release",
              "claim_next", "put_signal", "get_signals", "append_events", "read_events"):
    setattr(KubernetesStore, _name, _unavailable_when_unreachable(getattr(KubernetesStore, _name)))
