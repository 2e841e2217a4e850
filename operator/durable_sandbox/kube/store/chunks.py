"""The journal's chunks: the head's tail sealed into chunk objects ``dsb.K.j<first seq>`` when it grows past
``TAIL_BYTES``, and the journal read back from the chunks the head lists plus its tail."""

from __future__ import annotations

import asyncio
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged, LeaseLost
from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.kube.api.client import ApiException, is_conflict
from durable_sandbox.kube.journal.journal_objects import JournalObjects
from durable_sandbox.kube.store.codec import (
    CHUNK_BYTES,
    RunState,
    decode_record,
    dumps,
    jp,
    object_meta,
    run_key,
    seq_key,
)
from durable_sandbox.kube.store.heads import RunHeads


class JournalChunks:
    """The journal records of one namespace's runs, in heads and chunks."""

    def __init__(self, heads: RunHeads) -> None:
        self.heads = heads
        self.objects = heads.objects

    async def seal_tail(self, run_id: str, st: RunState, fence: int,
                        ops: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
        """Move the head's tail into the current chunk (a new one once it would pass ``CHUNK_BYTES``); add
        the head ops that drop the tail and list the chunk. Returns (new chunk list, sealed seqs).

        Chunk data is keyed by seq and every record was committed in the head before it is copied, so a
        copy is idempotent: if the head patch that should follow fails (this worker lost its lease), the
        chunk merely holds records that are still in the head, with the same content, and readers merge
        by seq. A chunk's ``last`` in the head's list is what counts."""
        key = run_key(run_id)
        head = await self.objects.get(st.name)
        if head is None:
            raise LeaseLost(run_id, fence)
        data = head.get("data") or {}
        tail = {k: v for k, v in data.items() if k.startswith("j.")}
        seqs = sorted(int(k[2:]) for k in tail)
        size = sum(len(v.encode()) for v in tail.values())
        chunks = [dict(c) for c in self.heads.loads(run_id, key, data, "chunks", st.name, "[]")]
        current = chunks[-1] if chunks and chunks[-1].get("bytes", CHUNK_BYTES) + size <= CHUNK_BYTES else None
        if current is not None:
            adds = [{"op": "add", "path": jp("data", k), "value": v} for k, v in sorted(tail.items())]
            await self.objects.patch(current["name"], adds)  # a missing chunk is an error (404), never recreated
            current["last"], current["bytes"] = seqs[-1], current["bytes"] + size
        else:
            name = f"dsb.{key}.j{seqs[0]:012d}"
            try:
                await self.objects.create(JournalObjects.body(object_meta(name, key, "journal", st.owners), tail))
            except ApiException as exc:
                if not is_conflict(exc):
                    raise
                # Left by an attempt whose head patch failed: the same records by seq; add ours to it.
                await self.objects.patch(name, [{"op": "add", "path": jp("data", k), "value": v}
                                                for k, v in sorted(tail.items())])
            chunks.append({"name": name, "first": seqs[0], "last": seqs[-1], "bytes": size})
        ops.extend({"op": "remove", "path": jp("data", k)} for k in sorted(tail))
        ops.append({"op": "add", "path": "/data/chunks", "value": self.heads.sealed(key, "chunks", dumps(chunks))})
        return chunks, seqs

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        head = await self.heads.head(run_id)
        if head is None:
            return []
        key, name = run_key(run_id), head["metadata"]["name"]
        st = self.heads.state(run_id)
        items = await self._stored_records(run_id, st, after_seq)
        items.update((int(k[2:]), (name, v)) for k, v in (head.get("data") or {}).items() if k.startswith("j."))
        seqs = list(range(after_seq + 1, st.seq + 1))
        missing = [s for s in seqs if s not in items]
        namespace = self.heads.namespace
        if missing:
            raise JournalDamaged(run_id, f"Journal {namespace}/{name}",
                                 f"records {missing[:5]} of 1..{st.seq} are missing", tampered=False)
        opened = [self.heads.opened(run_id, key, seq_key(s), items[s][1], items[s][0]) for s in seqs]
        texts = await asyncio.gather(*(self.heads.blobs.value(run_id, t, items[s][0])
                                       for s, t in zip(seqs, opened, strict=True)))
        out = []
        for s, text in zip(seqs, texts, strict=True):
            try:
                out.append(decode_record(s, text))
            except (KeyError, TypeError, ValueError) as exc:
                raise JournalDamaged(run_id, f"Journal {namespace}/{items[s][0]} key {seq_key(s)!r}",
                                     f"the record cannot be decoded ({type(exc).__name__}: {exc})",
                                     tampered=False) from None
        return out

    async def _stored_records(self, run_id: str, st: RunState, after_seq: int) -> dict[int, tuple[str, str]]:
        """seq -> (the chunk it was read from, its stored text), of the chunks the head lists past ``after_seq``."""
        chunks = [c for c in st.chunks if c["last"] > after_seq]
        bodies = await asyncio.gather(*(self.objects.get(c["name"]) for c in chunks))
        items: dict[int, tuple[str, str]] = {}
        for c, body in zip(chunks, bodies, strict=True):
            if body is None:
                raise JournalDamaged(run_id, f"Journal {self.heads.namespace}/{c['name']}",
                                     "this journal chunk, which the run's head lists, is missing", tampered=False)
            items.update((seq, (c["name"], v)) for k, v in (body.get("data") or {}).items()
                         if k.startswith("j.") and c["first"] <= (seq := int(k[2:])) <= c["last"])
        return items

    def journal_objects(self, run_id: str) -> list[str]:
        """Names of the run's sealed journal chunks as this instance last saw them (for ``status.journal``)."""
        st = self.heads.known(run_id)
        return [c["name"] for c in st.chunks] if st is not None else []
