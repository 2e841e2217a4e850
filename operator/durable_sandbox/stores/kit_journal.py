"""The store contract kit's cases of the journal: atomic, fenced commits, seqs in commit order, and what commits
write beside the journal (cache, thread state) (``stores/testing.py``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from durable_sandbox.engine.errors import LeaseLost, RunCancelledError
from durable_sandbox.engine.records import Commit, ErrorInfo, OperationRecord, RunStatus
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.kit_base import TTL, StoreKit, rec, shape

__all__ = ["JournalCases"]


class JournalCases(StoreKit):
    """The journal: ``commit`` is atomic and fenced, ``check_cancel`` refuses once cancel was requested, seqs grow
    in commit order and ``journal_since`` returns exactly the rows after a seq; cache entries and thread state."""

    async def test_commit_is_atomic_and_journal_ordered(self, store: Store) -> None:
        run = await self.new_run(store, thread_id="t-atomic")
        lease = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, lease.fence, Commit([rec("a", "started")]))
        await store.commit(
            run.run_id,
            lease.fence,
            Commit(
                [rec("a", "completed", {"v": [1, "x"]}), rec("b", "started")],
                run={"status": RunStatus.RUNNING, "pending_callbacks": ["cb"], "wake_at": 5.0},
                thread_state=("t-atomic", {"n": 1}),
                cache=("kit-key-" + run.run_id, {"v": 1}, None),
            ),
        )
        rows = await store.load_journal(run.run_id)
        assert shape(rows) == [("a", "started", None), ("a", "completed", {"v": [1, "x"]}), ("b", "started", None)]
        assert rows[0].seq < rows[1].seq < rows[2].seq, "seqs must grow in commit order"
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.RUNNING
        assert got.pending_callbacks == ["cb"] and got.wake_at == 5.0
        assert await store.get_thread_state("t-atomic") == {"n": 1}
        hit = await store.cache_get("kit-key-" + run.run_id, time.time())
        assert hit is not None and hit[0] == {"v": 1}

    async def test_records_round_trip_every_field(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        failed = OperationRecord(
            "op/1:x", "sandbox.call", "shell", "failed", 3, "sha256:ab",
            error=ErrorInfo("ValueError", "bad ✗", True, {"field": "x"}), meta={"nextAttemptAt": 12.5},
            ts=1_800_000_000.25, epoch=2,
        )
        started = OperationRecord("op-2", "step", "fn", "started", 1, None, result="ignored: not completed")
        done = OperationRecord("op-3", "step", "fn", "completed", 1, "d", result=None)
        await store.commit(run.run_id, lease.fence, Commit([failed, started, done]))
        got = await store.load_journal(run.run_id)
        assert [r.seq for r in got] == [failed.seq, started.seq, done.seq], "commit must set each record's seq"
        first = got[0]
        assert (first.op_id, first.kind, first.name, first.status, first.attempt, first.input_digest) == (
            "op/1:x", "sandbox.call", "shell", "failed", 3, "sha256:ab")
        assert first.error == ErrorInfo("ValueError", "bad ✗", True, {"field": "x"})
        assert first.meta == {"nextAttemptAt": 12.5} and first.ts == 1_800_000_000.25 and first.epoch == 2
        assert got[1].result is None and got[1].input_digest is None, "only completed records keep a result"
        assert got[2].status == "completed" and got[2].result is None

    async def test_large_results_round_trip(self, store: Store) -> None:
        """A result far larger than any single object of a server-side store (3 MiB) comes back whole."""
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        big = {"stdout": "x" * (3 * 1024 * 1024), "lines": ["é" * 100] * 10}
        await store.commit(run.run_id, lease.fence, Commit([rec("big", "completed", big), rec("small", "completed", 1)]))
        await store.update_run(run.run_id, {"result": big}, fence=lease.fence)
        rows = await store.load_journal(run.run_id)
        assert [r.op_id for r in rows] == ["big", "small"]
        assert rows[0].result == big and rows[1].result == 1
        got = await store.get_run(run.run_id)
        assert got is not None and got.result == big

    async def test_large_input_round_trips(self, store: Store) -> None:
        calls = [{"type": "shell", "args": {"command": f"echo {i} " + "y" * 200}} for i in range(8000)]
        run = await self.new_run(store, input={"toolCalls": calls})
        got = await store.get_run(run.run_id)
        assert got is not None and got.input == {"toolCalls": calls}

    async def test_seq_assignment_and_journal_since(self, store: Store) -> None:
        run = await self.new_run(store)
        other = await self.new_run(store, "other")
        lease = await store.claim(run.run_id, "w1", TTL)
        other_lease = await store.claim(other.run_id, "w1", TTL)
        seqs: list[int] = []
        for i in range(6):
            recs = [rec(f"s{i}", "started"), rec(f"s{i}", "completed", i)]
            await store.commit(run.run_id, lease.fence, Commit(recs))
            await store.commit(other.run_id, other_lease.fence, Commit([rec(f"o{i}", "completed", -i)]))
            seqs.extend(r.seq for r in recs)
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"seqs not strictly increasing: {seqs}"
        rows = await store.load_journal(run.run_id)
        assert [r.seq for r in rows] == seqs, "load_journal must return the run's own rows in commit order"
        assert {r.op_id[0] for r in rows} == {"s"}, "another run's rows leaked into the journal"
        assert await store.journal_since(run.run_id, 0) == rows
        for k in (1, 5, len(seqs) - 1):
            assert [r.seq for r in await store.journal_since(run.run_id, seqs[k - 1])] == seqs[k:]
        assert await store.journal_since(run.run_id, seqs[-1]) == []
        assert await store.load_journal(self.run_id("missing")) == []

    async def test_commit_with_stale_fence_raises_lease_lost_and_writes_nothing(self, store: Store) -> None:
        run = await self.new_run(store)
        old = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, old.fence, Commit([rec("a", "started")]))
        new = await store.claim(run.run_id, "w1", TTL)  # a re-claim moves the fence like a takeover
        assert new.fence > old.fence
        before = shape(await store.load_journal(run.run_id))
        cache_key = "kit-stale-" + run.run_id
        with pytest.raises(LeaseLost):  # one record
            await store.commit(run.run_id, old.fence, Commit([rec("a", "completed", 1)]))
        with pytest.raises(LeaseLost):  # everything a commit can carry
            await store.commit(
                run.run_id,
                old.fence,
                Commit(
                    [rec("a", "completed", 1), rec("b")],
                    run={"status": RunStatus.SUCCEEDED, "result": 1},
                    thread_state=("t-stale", {"x": 1}),
                    cache=(cache_key, 1, None),
                ),
            )
        with pytest.raises(LeaseLost):  # no records, run changes only
            await store.commit(run.run_id, old.fence, Commit([], run={"status": RunStatus.FAILED}))
        assert shape(await store.load_journal(run.run_id)) == before
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.PENDING and got.result is None
        assert await store.get_thread_state("t-stale") is None and await store.cache_get(cache_key, 0) is None
        await store.commit(run.run_id, new.fence, Commit([rec("a", "completed", 2)]))
        assert shape(await store.load_journal(run.run_id))[-1] == ("a", "completed", 2)

    async def test_commit_to_a_missing_run_raises_lease_lost(self, store: Store) -> None:
        with pytest.raises(LeaseLost):
            await store.commit(self.run_id("missing"), 1, Commit([rec("a")]))

    async def test_check_cancel_refuses_after_cancel_was_requested(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, lease.fence, Commit([rec("a", "started")], check_cancel=True))
        await store.update_run(run.run_id, {"cancel_requested": "stop now"})
        with pytest.raises(RunCancelledError) as info:
            await store.commit(run.run_id, lease.fence, Commit([rec("b", "started")], check_cancel=True))
        assert info.value.reason == "stop now"
        assert [r.op_id for r in await store.load_journal(run.run_id)] == ["a"]
        # Without check_cancel the worker can still record its cleanup and the final status.
        await store.commit(
            run.run_id, lease.fence, Commit([rec("a", "failed")], run={"status": RunStatus.CANCELLED})
        )
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.CANCELLED and got.cancel_requested == "stop now"

    async def test_a_completion_and_the_next_start_in_one_commit_land_together_in_order(self, store: Store) -> None:
        """The engine's commit shape for consecutive sandbox calls (``RunRuntime.defer_completion``): call i's
        completion rides on call i+1's start, one commit. All or nothing, in order (the completion's seq
        before the start's): refused whole under a cancel request or a stale fence, so call i+1 never
        starts on a journal that lacks call i's result."""
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, lease.fence, Commit([rec("c1", "started")], check_cancel=True))
        await store.commit(run.run_id, lease.fence,
                           Commit([rec("c1", "completed", {"out": 1}), rec("c2", "started")], check_cancel=True))
        rows = await store.load_journal(run.run_id)
        assert shape(rows) == [("c1", "started", None), ("c1", "completed", {"out": 1}), ("c2", "started", None)]
        assert rows[0].seq < rows[1].seq < rows[2].seq, "one commit's records keep their order"
        pair = [rec("c2", "completed", {"out": 2}), rec("c3", "started")]
        await store.update_run(run.run_id, {"cancel_requested": "stop"})
        with pytest.raises(RunCancelledError):
            await store.commit(run.run_id, lease.fence, Commit(pair, check_cancel=True))
        assert len(await store.load_journal(run.run_id)) == 3, "a refused commit writes none of its records"
        newer = await store.claim(run.run_id, "w2", TTL, take_over_from="w1")
        with pytest.raises(LeaseLost):
            await store.commit(run.run_id, lease.fence, Commit(pair))
        assert len(await store.load_journal(run.run_id)) == 3, "a stale fence writes none of its records"
        # What a final commit does with a completion still waiting for its ride: it lands with the status.
        await store.commit(run.run_id, newer.fence, Commit(pair[:1], run={"status": RunStatus.CANCELLED}))
        rows = await store.load_journal(run.run_id)
        assert shape(rows)[-1] == ("c2", "completed", {"out": 2})
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.CANCELLED

    # ------------------------------------------------------------------ cache and thread state

    async def test_cache_expires_by_now_and_clears_by_key_prefix_or_all(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        now = time.time()
        entries: list[tuple[str, Any, float | None]] = [
            ("kit:a:1", {"v": 1}, now + 10), ("kit:a:2", [2], None), ("kit:b:1", "three", None),
            ("other:1", 4, None),
        ]
        for entry in entries:
            await store.commit(run.run_id, lease.fence, Commit([], cache=entry))
        hit = await store.cache_get("kit:a:1", now)
        assert hit is not None and hit[0] == {"v": 1} and abs(hit[1] - now) < 600
        assert await store.cache_get("kit:a:1", now + 11) is None, "an entry past expires_at must not be served"
        assert (await store.cache_get("kit:a:2", now + 10**6)) is not None, "no expiry means it never expires"
        assert await store.cache_get("kit:none", now) is None
        await store.commit(run.run_id, lease.fence, Commit([], cache=("kit:a:2", [22], None)))  # overwrite
        assert (await store.cache_get("kit:a:2", now))[0] == [22]  # type: ignore[index]
        assert await store.cache_clear("kit:b:1") == 1
        assert await store.cache_get("kit:b:1", now) is None
        assert await store.cache_clear("kit:b:1") == 0
        assert await store.cache_clear(prefix="kit:a:") == 2
        assert await store.cache_get("kit:a:2", now) is None and await store.cache_get("other:1", now) is not None
        assert await store.cache_clear() == 1
        assert await store.cache_get("other:1", now) is None

    async def test_thread_state_is_written_by_commits_and_shared_by_runs(self, store: Store) -> None:
        first = await self.new_run(store, "first", thread_id="t-shared")
        second = await self.new_run(store, "second", thread_id="t-shared")
        assert await store.get_thread_state("t-shared") is None
        lease = await store.claim(first.run_id, "w1", TTL)
        await store.commit(first.run_id, lease.fence, Commit([rec("a")], thread_state=("t-shared", {"n": 1})))
        assert await store.get_thread_state("t-shared") == {"n": 1}
        lease2 = await store.claim(second.run_id, "w1", TTL)
        await store.commit(second.run_id, lease2.fence, Commit([], thread_state=("t-shared", {"n": 2, "l": [1]})))
        assert await store.get_thread_state("t-shared") == {"n": 2, "l": [1]}
        assert await store.get_thread_state("t-other") is None
