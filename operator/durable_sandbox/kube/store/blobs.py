"""Values too large to keep inline (a big record or run field): split into content-addressed ``blob`` objects
``dsb.K.b<digest>.<part>`` and referenced as ``@name,name``; checked against the digest on every read."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.kube.api.client import ApiException, is_conflict
from durable_sandbox.kube.journal.journal_objects import JournalObjects
from durable_sandbox.kube.store.codec import BLOB_PART_BYTES, object_meta


class Blobs:
    """The blob objects of one namespace."""

    def __init__(self, objects: JournalObjects) -> None:
        self.objects = objects

    async def put_value(self, key: str, text: str, limit: int, owners: list[dict[str, Any]]) -> str:
        """``text`` itself if small, else stored in blob objects and returned as ``@name,name``."""
        if len(text.encode()) <= limit:
            return text
        ascii_text = json.dumps(json.loads(text), separators=(",", ":"))  # 1 char = 1 byte: exact parts
        digest = hashlib.sha256(ascii_text.encode()).hexdigest()[:20]
        parts = [ascii_text[i:i + BLOB_PART_BYTES] for i in range(0, len(ascii_text), BLOB_PART_BYTES)]
        names = [f"dsb.{key}.b{digest}.{i}" for i in range(len(parts))]

        async def put(name: str, part: str) -> None:
            try:
                await self.objects.create(JournalObjects.body(object_meta(name, key, "blob", owners), {"v": part}))
            except ApiException as exc:
                if not is_conflict(exc):  # content-addressed: an existing blob holds the same bytes
                    raise

        await asyncio.gather(*(put(n, p) for n, p in zip(names, parts, strict=True)))
        return "@" + ",".join(names)

    async def value(self, run_id: str, text: str, where: str) -> str:
        """``text`` itself, or the content of the blobs it references, checked against their digest."""
        if not text.startswith("@"):
            return text
        names = text[1:].split(",")
        blobs = await asyncio.gather(*(self.objects.get(n) for n in names))
        missing = [n for n, b in zip(names, blobs, strict=True) if b is None]
        namespace = self.objects.namespace
        if missing:
            raise JournalDamaged(run_id, f"Journal {namespace}/{where}",
                                 f"the value object(s) {missing} it references are missing", tampered=False)
        content = "".join(str((b.get("data") or {}).get("v", "")) for b in blobs if b is not None)
        digest = names[0].rsplit(".", 2)[-2][1:]  # dsb.<key>.b<digest>.<part>
        if hashlib.sha256(content.encode()).hexdigest()[:20] != digest:
            raise JournalDamaged(run_id, f"Journal {namespace}/{names[0]}",
                                 "the value's content does not match the digest in its name", tampered=True)
        return content
