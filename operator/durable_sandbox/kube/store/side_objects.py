"""Thread state (``dsb.thread.<digest>``) and cache entries (``dsb.cache.<digest>``), each an object of its own,
and the **redo** that writes them: a commit carrying them records them in the head (``redo``) in its own fenced
patch and writes them right after, so a worker that dies in between has them re-applied at the next claim."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged
from durable_sandbox.engine.records import Commit
from durable_sandbox.kube.api.client import ApiException, is_conflict, is_not_found
from durable_sandbox.kube.journal.journal_objects import LABEL_PART, JournalObjects
from durable_sandbox.kube.store.codec import INLINE_FIELD_BYTES, RETRIES, dumps, object_meta, side_name
from durable_sandbox.kube.store.heads import RunHeads


def plan_redo(run_id: str, fence: int, seq: int, commit: Commit) -> dict[str, Any] | None:
    """What a commit leaves for the side objects (None: nothing), with the writer that makes it idempotent."""
    if commit.thread_state is None and commit.cache is None:
        return None
    redo: dict[str, Any] = {"writer": f"{run_id}:{fence}:{seq}:{time.time()}"}
    if commit.thread_state is not None:
        redo["thread"] = list(commit.thread_state)
    if commit.cache is not None:
        redo["cache"] = list(commit.cache)
    return redo


class SideObjects:
    """The thread-state and cache objects of one namespace."""

    def __init__(self, heads: RunHeads) -> None:
        self.heads = heads
        self.objects = heads.objects

    async def apply_redo(self, redo: dict[str, Any], *, only_if_ours: bool = False) -> None:
        """Write a commit's thread state and cache entry to their objects (idempotent: a full replace)."""
        writer: str = redo["writer"]
        run_id = writer.rsplit(":", 3)[0]
        writes: list[tuple[str, str, dict[str, str], Any]] = []
        if "thread" in redo:
            tid, state = redo["thread"]
            writes.append((side_name("thread", tid), "thread", {"thread": dumps(tid)}, state))
        if "cache" in redo:
            ckey, value, expires = redo["cache"]
            writes.append((side_name("cache", ckey), "cache",
                           {"key": dumps(ckey), "createdAt": dumps(time.time()), "expiresAt": dumps(expires)},
                           value))
        for name, part, data, value in writes:
            if only_if_ours:
                current = await self.objects.get(name)
                if current is not None:
                    was = self._side(current, "writer", "")
                    if was == writer or was.rsplit(":", 3)[0] != run_id:
                        continue  # applied already, or another run wrote since: that write is newer
            digest = name.rsplit(".", 1)[1]
            data["writer"] = dumps(writer)
            data["value"] = await self.heads.blobs.put_value(digest, dumps(value), INLINE_FIELD_BYTES, [])
            body = {"metadata": object_meta(name, None, part, []),
                    "data": {k: self.heads.sealed(name, k, v) for k, v in data.items()}}
            await self._upsert(name, body)

    async def _upsert(self, name: str, body: dict[str, Any]) -> None:
        """Create ``name`` or overwrite its data. A merge patch: a custom object cannot be replaced without
        the resourceVersion it was read at, and these writes are last-writer-wins by design."""
        for _ in range(RETRIES):
            try:
                await self.objects.merge(name, body["data"])
                return
            except ApiException as exc:
                if not is_not_found(exc):
                    raise
            try:
                await self.objects.create(JournalObjects.body(body["metadata"], body["data"]))
                return
            except ApiException as exc:
                if not is_conflict(exc):
                    raise
        raise RuntimeError(f"Could not write Journal {self.heads.namespace}/{name}: it kept being created and deleted")

    def _side(self, obj: dict[str, Any], key: str, default: Any) -> Any:
        """A value of a thread-state or cache object, opened and decoded."""
        name = obj["metadata"]["name"]
        return self.heads.loads("", name, obj.get("data") or {}, key, name, dumps(default))

    async def _side_value(self, obj: dict[str, Any]) -> Any:
        name = obj["metadata"]["name"]
        stored = (obj.get("data") or {}).get("value")
        if stored is None:
            return None
        text = await self.heads.blobs.value("", self.heads.opened("", name, "value", str(stored), name), name)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise JournalDamaged("", f"Journal {self.heads.namespace}/{name} key 'value'", f"not JSON ({exc})",
                                 tampered=False) from None

    async def get_thread_state(self, thread_id: str) -> Any:
        obj = await self.objects.get(side_name("thread", thread_id))
        return None if obj is None else await self._side_value(obj)

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        obj = await self.objects.get(side_name("cache", key))
        if obj is None:
            return None
        expires = self._side(obj, "expiresAt", None)
        if expires is not None and expires <= now:
            return None
        return await self._side_value(obj), float(self._side(obj, "createdAt", 0.0))

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        if key is not None:
            return int(await self.objects.delete(side_name("cache", key)))
        entries = await self.objects.select(f"{LABEL_PART}=cache")
        doomed = [e["metadata"]["name"] for e in entries
                  if prefix is None or str(self._side(e, "key", "")).startswith(prefix)]
        deleted = await asyncio.gather(*(self.objects.delete(n) for n in doomed))
        return sum(deleted)
