"""One fenced commit: the run's records, run changes and chunk rollover as one JSON Patch of its head
(``test fence``, ``test`` no cancel request, ``test seq``, the records, the run fields, the redo), retried when the
head moved or the answer was lost; then the side objects the redo names."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from durable_sandbox.engine import faults
from durable_sandbox.engine.errors import LeaseLost, RunCancelledError, StoreUnavailable
from durable_sandbox.engine.records import Commit
from durable_sandbox.kube.api.client import ApiException, is_not_found, is_precondition_failed, is_transient
from durable_sandbox.kube.store.chunks import JournalChunks
from durable_sandbox.kube.store.codec import (
    INLINE_RECORD_BYTES,
    TAIL_BYTES,
    TRANSIENT_RETRIES,
    RunState,
    dumps,
    encode_record,
    jp,
    run_key,
    seq_key,
)
from durable_sandbox.kube.store.heads import RunHeads
from durable_sandbox.kube.store.refusals import REFUSALS, api_message
from durable_sandbox.kube.store.runs import Runs
from durable_sandbox.kube.store.side_objects import SideObjects, plan_redo

log = logging.getLogger("durable_sandbox.kube.store")


@dataclass
class _HeadPatch:
    """One attempt's patch of the head, and what it assigns."""

    ops: list[dict[str, Any]]
    first: int  # the seq of its first record
    seq: int  # the head's seq once it lands
    stored: list[str]  # the records as stored in the head, sealed
    sealed: tuple[list[dict[str, Any]], list[int]] | None  # (the new chunk list, the seqs moved) when it rolls over
    redo: dict[str, Any] | None


class Commits:
    """Fenced commits to one namespace's run heads."""

    def __init__(self, heads: RunHeads, runs: Runs, chunks: JournalChunks, side: SideObjects) -> None:
        self.heads = heads
        self.objects = heads.objects
        self.runs = runs
        self.chunks = chunks
        self.side = side

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        refresh = False
        uncertain = 0  # attempts whose outcome we do not know (the answer was lost or the server failed)
        unsure: list[_HeadPatch] = []  # those attempts: one may land after its check said it had not
        for _ in range(3 + TRANSIENT_RETRIES):
            st = await self.heads.fenced_state(run_id, fence, refresh=refresh)
            if self._landed_late(commit, st, unsure):
                patch = unsure[-1]
                break
            patch = await self._head_patch(run_id, st, fence, commit)
            try:
                await self.objects.patch(st.name, patch.ops)
            except Exception as exc:
                if is_not_found(exc):
                    raise LeaseLost(run_id, fence) from None
                if is_transient(exc) and uncertain >= TRANSIENT_RETRIES:
                    # The API server stayed away (a restart): not a failure of the run; the worker stops
                    # and the run resumes from its journal once claimed again.
                    raise StoreUnavailable(f"{type(exc).__name__}: {exc}", run_id) from exc
                if is_transient(exc):
                    uncertain += 1
                    unsure.append(patch)
                    if await self._landed(run_id, fence, commit, patch, uncertain):
                        break
                elif is_precondition_failed(exc):
                    await self._check_still_ours(run_id, fence, commit, st)
                else:
                    raise
                refresh = True  # our idea of seq or the tail was stale: try again from the head
                continue
            self._remember(st, commit, patch)
            break
        else:
            raise RuntimeError(
                f"Could not append to the journal of run {run_id!r} in namespace {self.heads.namespace!r}: the head "
                f"kept changing under a valid fence, or the API server kept failing; the worker stops here and "
                f"the run resumes from its journal when claimed again."
            )
        if patch.redo is not None:
            await self._write_side_objects(run_id, st.name, patch.redo)

    async def _head_patch(self, run_id: str, st: RunState, fence: int, commit: Commit) -> _HeadPatch:
        key = run_key(run_id)
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/data/fence", "value": str(fence)}]
        if commit.check_cancel:
            ops.append({"op": "test", "path": "/data/run.cancel_requested",
                        "value": self.heads.sealed(key, "run.cancel_requested", "null")})
        ops.append({"op": "test", "path": "/data/seq", "value": str(st.seq)})
        encoded: list[str] = []
        for r in commit.records:
            encoded.append(await self.heads.blobs.put_value(key, encode_record(r), INLINE_RECORD_BYTES, st.owners))
        new_bytes = sum(len(e.encode()) for e in encoded)
        sealed: tuple[list[dict[str, Any]], list[int]] | None = None
        if st.tail and sum(st.tail.values()) + new_bytes > TAIL_BYTES:
            sealed = await self.chunks.seal_tail(run_id, st, fence, ops)
        first, seq = st.seq + 1, st.seq
        stored: list[str] = []
        for text in encoded:
            seq += 1
            stored.append(self.heads.sealed(key, seq_key(seq), text))
            ops.append({"op": "add", "path": jp("data", seq_key(seq)), "value": stored[-1]})
        if commit.records:
            ops.append({"op": "replace", "path": "/data/seq", "value": str(seq)})
        if commit.run:
            ops.extend(await self.runs.field_ops(run_id, commit.run, st.owners))
        redo = plan_redo(run_id, fence, seq, commit)
        if redo is not None:
            ops.append({"op": "add", "path": "/data/redo", "value": self.heads.sealed(key, "redo", dumps(redo))})
        return _HeadPatch(ops=ops, first=first, seq=seq, stored=stored, sealed=sealed, redo=redo)

    async def _landed(self, run_id: str, fence: int, commit: Commit, patch: _HeadPatch, uncertain: int) -> bool:
        """Whether a patch whose answer was lost landed. Only the holder of ``fence`` moves ``seq``, so the
        head tells: seq at our last record = it landed (its records get their seqs); unchanged = it did not."""
        await asyncio.sleep(0.2 * 2**uncertain)
        try:
            head = await self.heads.head_retrying(run_id)
        except Exception as err:
            if is_transient(err):
                raise StoreUnavailable(f"{type(err).__name__}: {err}", run_id) from err
            raise
        if head is None or self.heads.state(run_id).fence != fence:
            raise LeaseLost(run_id, fence) from None
        if commit.records and self.heads.state(run_id).seq == patch.seq:
            for r, s in zip(commit.records, range(patch.first, patch.seq + 1), strict=True):
                r.seq = s
            return True
        return False

    @staticmethod
    def _landed_late(commit: Commit, st: RunState, unsure: list[_HeadPatch]) -> bool:
        """Whether an attempt whose answer was lost landed after all, after its check read the head (the
        retry's ``test seq`` then fails, and without this the records would be appended again): only the
        holder of the fence moves ``seq``, so the head's seq at that attempt's last record means it landed.
        Its records get their seqs, and it goes last in ``unsure`` (its redo is the one to write)."""
        landed = next((p for p in unsure if commit.records and st.seq == p.seq), None)
        if landed is None:
            return False
        for r, s in zip(commit.records, range(landed.first, landed.seq + 1), strict=True):
            r.seq = s
        unsure.remove(landed)
        unsure.append(landed)
        return True

    async def _check_still_ours(self, run_id: str, fence: int, commit: Commit, st: RunState) -> None:
        """After a failed ``test``: LeaseLost when the fence moved, RunCancelledError when a cancel came first."""
        head = await self.heads.head(run_id)
        if head is None or self.heads.state(run_id).fence != fence:
            raise LeaseLost(run_id, fence) from None
        cancel = await self.heads.field(run_id, head.get("data") or {}, "cancel_requested", st.name)
        if commit.check_cancel and cancel is not None:
            raise RunCancelledError(run_id, cancel) from None

    @staticmethod
    def _remember(st: RunState, commit: Commit, patch: _HeadPatch) -> None:
        """The head as the landed patch left it, and the records' seqs."""
        for r, text, s in zip(commit.records, patch.stored, range(patch.first, patch.seq + 1), strict=True):
            r.seq = s
            st.tail[s] = len(text.encode())
        if patch.sealed is not None:
            st.chunks = patch.sealed[0]
            for s in patch.sealed[1]:
                st.tail.pop(s, None)
        st.seq = patch.seq

    async def _write_side_objects(self, run_id: str, head: str, redo: dict[str, Any]) -> None:
        faults.reach("kube.store.before_side_writes")  # crash tests: the head has the redo, nothing else
        try:
            await self.side.apply_redo(redo)
        except ApiException as exc:
            if exc.status not in REFUSALS:
                raise
            # The commit landed (the head has its records and the redo): raised as a refusal, it would be
            # offered again by a run held at it (engine/refusals.py) and its records written twice. The next
            # claim of the run applies the redo from the head.
            log.warning("Journal %s/%s: writing run %s's thread state or cache entry was refused (%s %s); "
                        "the next claim of the run writes it", self.heads.namespace, head, run_id, exc.status,
                        api_message(exc))
