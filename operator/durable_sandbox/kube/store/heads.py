"""A run's head as this store instance knows it: the bookkeeping of each run's fence, seq, chunks and tail,
and the sealed values read from a head (opened, their blobs resolved, decoded). Every other part of the store
reads heads through this."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from durable_sandbox.engine.errors import JournalDamaged, LeaseLost
from durable_sandbox.engine.records import ErrorInfo, RunRecord, RunStatus
from durable_sandbox.kube.api.client import is_transient
from durable_sandbox.kube.journal.journal_objects import JournalObjects
from durable_sandbox.kube.journal.sealing import Sealer
from durable_sandbox.kube.store.blobs import Blobs
from durable_sandbox.kube.store.codec import (
    RUN_FIELDS,
    TRANSIENT_RETRIES,
    RunState,
    head_name,
    run_id_of,
    run_key,
)


class RunHeads:
    """Heads of one namespace's runs: read, remembered per run, and their sealed values opened."""

    def __init__(self, objects: JournalObjects, sealer: Sealer, blobs: Blobs) -> None:
        self.objects = objects
        self.namespace = objects.namespace
        self.sealer = sealer
        self.blobs = blobs
        self._runs: dict[str, RunState] = {}

    # ------------------------------------------------------------------ sealed values (kube/journal/sealing.py)

    def sealed(self, scope: str, name: str, value: str) -> str:
        return self.sealer.seal(scope, name, value)

    def opened(self, run_id: str, scope: str, name: str, stored: str, where: str) -> str:
        return self.sealer.open(scope, name, stored, run_id=run_id, where=f"Journal {self.namespace}/{where}")

    def loads(self, run_id: str, scope: str, data: dict[str, Any], name: str, where: str, default: str) -> Any:
        """The JSON value of ``data[name]``, opened and decoded; :class:`JournalDamaged` when it is not."""
        text = data.get(name)
        if text is None:
            return json.loads(default)
        opened = self.opened(run_id, scope, name, str(text), where)
        try:
            return json.loads(opened)
        except ValueError as exc:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{where} key {name!r}",
                                 f"not JSON ({exc})", tampered=False) from None

    async def field(self, run_id: str, data: dict[str, Any], name: str, where: str) -> Any:
        """A run field of a head: opened, its blobs resolved, decoded."""
        key = f"run.{name}"
        text = data.get(key)
        if text is None:
            return None
        value = await self.blobs.value(run_id, self.opened(run_id, run_key(run_id), key, str(text), where), where)
        try:
            return json.loads(value)
        except ValueError as exc:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{where} key {key!r}", f"not JSON ({exc})",
                                 tampered=False) from None

    # ------------------------------------------------------------------ the bookkeeping of heads

    def state_from_head(self, run_id: str, head: dict[str, Any]) -> RunState:
        data = head.get("data") or {}
        name = head["metadata"]["name"]
        tail = {int(k[2:]): len(v.encode()) for k, v in data.items() if k.startswith("j.")}
        try:
            fence, seq = int(data.get("fence", "0")), int(data.get("seq", "0"))
        except ValueError:
            raise JournalDamaged(run_id, f"Journal {self.namespace}/{name}", "fence or seq is not a number",
                                 tampered=False) from None
        st = RunState(
            name=name, fence=fence, seq=seq, chunks=self.loads(run_id, run_key(run_id), data, "chunks", name, "[]"),
            tail=tail, owners=list(head["metadata"].get("ownerReferences") or []),
        )
        old = self._runs.get(run_id)
        if old is not None:
            st.events_seq = old.events_seq
        self._runs[run_id] = st
        return st

    def state(self, run_id: str) -> RunState:
        """The run's head as last read (by :meth:`head`, which every caller of this made first)."""
        return self._runs[run_id]

    def known(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    async def head(self, run_id: str) -> dict[str, Any] | None:
        head = await self.objects.get(head_name(run_id))
        if head is not None:
            self.state_from_head(run_id, head)
        return head

    async def head_retrying(self, run_id: str) -> dict[str, Any] | None:
        for attempt in range(TRANSIENT_RETRIES):
            try:
                return await self.head(run_id)
            except Exception as exc:
                if not is_transient(exc) or attempt == TRANSIENT_RETRIES - 1:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        return None  # pragma: no cover - the loop returns or raises

    async def fenced_state(self, run_id: str, fence: int, *, refresh: bool = False) -> RunState:
        st = self._runs.get(run_id)
        if refresh or st is None or st.fence != fence:
            if await self.head(run_id) is None:
                raise LeaseLost(run_id, fence)
            st = self._runs[run_id]
        if st.fence != fence:
            raise LeaseLost(run_id, fence)
        return st

    async def owners(self, run_id: str) -> list[dict[str, Any]]:
        """The run's owner references (for objects it creates), read from its head once per instance."""
        st = self._runs.get(run_id)
        if st is None and await self.head(run_id) is not None:
            st = self._runs[run_id]
        return st.owners if st is not None else []

    async def run_from_head(self, head: dict[str, Any]) -> RunRecord:
        data = head.get("data") or {}
        run_id, where = run_id_of(head), head["metadata"]["name"]
        texts = [await self.field(run_id, data, f, where) for f in RUN_FIELDS]  # blobs are rare: no gather
        values = dict(zip(RUN_FIELDS, texts, strict=True))
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
