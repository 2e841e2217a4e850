"""Store contract kit: a reusable pytest suite proving that a store honours ``engine.store.Store``.

Usage (any store, ours or a third party's)::

    import pytest
    from durable_sandbox.stores.testing import StoreContractSuite

    class TestMyStoreContract(StoreContractSuite):
        @pytest.fixture
        async def store(self, tmp_path):
            s = MyStore(...)          # an EMPTY store: no runs, cache entries or thread state
            yield s
            await s.close()

        async def expire_lease(self, store, lease):   # make ``lease`` expire as ``store`` judges it (no sleeping)
            ...

        @pytest.fixture
        async def peer(self, store):   # optional: a second instance over the same data (another process's view)
            ...

        async def damage_run_cells(self, store, run_id, cells):   # optional: overwrite a run's cells with raw text
            ...

pytest collects every ``test_*`` method of the subclass. Tests that need a hook the subclass did not supply
are skipped with a message naming the hook. Run ids are lowercase DNS labels (``[a-z0-9-]``), which every
store accepts. Requires pytest-asyncio (auto mode or ``asyncio`` markers applied by the subclass).

The rules, each a test below: ``create_run`` is idempotent and round-trips every field; ``commit`` is
atomic (journal rows, run changes, thread state and cache entry together) and fenced (a stale fence writes
nothing, ``LeaseLost``); ``check_cancel`` refuses once cancel was requested; a completion and the next
start in one commit land together in order or not at all; seqs grow in commit order and
``journal_since`` returns exactly the rows after a seq; claim/renew/release with fencing (every claim moves
the fence; a stale lease can neither renew nor release); ``claim_next`` picks pending, due and orphaned runs
and nothing else; ``delete_run`` removes a run with its journal, events and signals, fenced; signals are
idempotent for the same value and conflict for a different one; events are
ordered per run; cache entries expire by ``now`` and clear by key, prefix or all; ``list_runs`` filters; a
damaged cell of a run's row reads as empty and the run's error names it, so one bad row never fails a listing
(``damage_run_cells`` hook, for stores of rows of text cells).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from durable_sandbox.engine.errors import LeaseHeld, LeaseLost, RunCancelledError, RunNotFound, SignalConflict
from durable_sandbox.engine.records import (
    Commit,
    ErrorInfo,
    Event,
    Lease,
    OperationRecord,
    RunRecord,
    RunStatus,
)
from durable_sandbox.engine.store import Store

__all__ = ["DamagedRowCases", "StoreContractSuite"]

TTL = 30.0


def _rec(op_id: str, status: str = "completed", result: Any = None, **kw: Any) -> OperationRecord:
    return OperationRecord(op_id, "step", "fn", status, 1, "digest", result, **kw)


def _shape(rows: list[OperationRecord]) -> list[tuple[str, str, Any]]:
    return [(r.op_id, r.status, r.result) for r in rows]


class StoreKit:
    """The kit's fixtures, hooks and helpers: override :meth:`store` (and the hooks you can supply)."""

    @pytest.fixture
    async def store(self) -> Any:
        raise NotImplementedError("override the `store` fixture: yield an empty store, close it afterwards")

    @pytest.fixture
    async def peer(self, store: Store) -> Any:
        """A second instance over the same data; skipped unless overridden."""
        pytest.skip("the store kit's `peer` fixture is not supplied: the two-instance tests need it")

    async def expire_lease(self, store: Store, lease: Lease) -> None:
        """Make ``lease`` expired as ``store`` judges it, without sleeping. Override to run the expiry tests."""
        pytest.skip("the store kit's `expire_lease` hook is not supplied: the lease expiry tests need it")

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def run_id(tag: str = "run") -> str:
        return f"{tag}-{uuid.uuid4().hex[:10]}"

    async def new_run(self, store: Store, tag: str = "run", **fields: Any) -> RunRecord:
        fields.setdefault("workflow", "kit.flow")
        fields.setdefault("input", {"n": 1})
        run, created = await store.create_run(RunRecord(run_id=self.run_id(tag), **fields))
        assert created, f"create_run of a new id {run.run_id!r} reported an existing run"
        return run


class DamagedRowCases(StoreKit):
    """A damaged row (a cell written behind the store's back, a disk error, a bad restore) as every store reads it:
    one bad row never fails a listing, and the run says which of its cells are damaged, the same way on every store.
    Needs the :meth:`damage_run_cells` hook."""

    async def damage_run_cells(self, store: Store, run_id: str, cells: dict[str, str]) -> None:
        """Overwrite cells of run ``run_id``'s row with ``cells``' raw text (column name to text), as damage would.
        Override to run the damaged-row tests (a store without rows of text cells has nothing to damage)."""
        pytest.skip("the store kit's `damage_run_cells` hook is not supplied: the damaged-row tests need it")

    async def test_a_damaged_row_never_fails_a_listing_and_says_which_cells(self, store: Store) -> None:
        good = await self.new_run(store, "good", labels={"team": "a"})
        bad = await self.new_run(store, "bad", labels={"team": "b"})
        # JSON that does not parse, JSON of the wrong shape, an error that is none, a status no run has.
        await self.damage_run_cells(store, bad.run_id, {
            "result": "[1,", "labels": "[1]", "pending_callbacks": '{"x": 1}', "error": '"oops"', "status": "exploded",
        })
        listed = {r.run_id: r for r in await store.list_runs(limit=10)}
        assert set(listed) == {good.run_id, bad.run_id}
        assert listed[good.run_id].error is None and listed[good.run_id].labels == {"team": "a"}
        for damaged in (listed[bad.run_id], await store.get_run(bad.run_id)):
            assert damaged is not None and damaged.error is not None
            assert damaged.error.type == "StoreDamaged"
            assert damaged.error.message.startswith(f"Run {bad.run_id!r} in ")
            assert "damaged column(s) error, labels, pending_callbacks, result, status" in damaged.error.message
            assert "Restore the store from a backup" in damaged.error.message
            assert (damaged.status, damaged.result, damaged.labels, damaged.pending_callbacks) == (
                RunStatus.FAILED, None, {}, [])
            assert damaged.input == {"n": 1}  # an undamaged cell reads as it was


class StoreContractSuite(DamagedRowCases):
    """Subclass as ``Test<Something>`` and override :meth:`store` (and the hooks you can supply)."""

    # ------------------------------------------------------------------ runs

    async def test_create_run_is_idempotent_and_round_trips_fields(self, store: Store) -> None:
        run = RunRecord(
            run_id=self.run_id(),
            workflow="kit.flow",
            status=RunStatus.WAITING,
            input={"list": [1, "two", None, {"x": 1.5}], "unicode": "héllo ✓"},
            thread_id="thread-1",
            wake_at=1_900_000_000.5,
            pending_callbacks=["approve"],
            labels={"team": "kit"},
            workflow_ref="pkg.module:flow",
        )
        stored, created = await store.create_run(run)
        assert created and stored.run_id == run.run_id
        again, created = await store.create_run(RunRecord(run_id=run.run_id, workflow="other", input=None))
        assert not created, "create_run of an existing id must not create"
        assert again.workflow == "kit.flow" and again.input == run.input, "the first run must be kept, unchanged"
        got = await store.get_run(run.run_id)
        assert got is not None
        for name in ("workflow", "status", "input", "thread_id", "wake_at", "pending_callbacks", "labels",
                     "workflow_ref", "result", "error", "cancel_requested", "epoch"):
            assert getattr(got, name) == getattr(run, name), f"RunRecord.{name} did not round-trip"
        assert isinstance(got.status, RunStatus)
        assert await store.get_run(self.run_id("missing")) is None

    async def test_list_runs_filters_by_status_and_workflow_newest_first(self, store: Store) -> None:
        now = time.time()
        a = await self.new_run(store, "a", workflow="x", status=RunStatus.SUCCEEDED, created_at=now - 30)
        b = await self.new_run(store, "b", workflow="y", created_at=now - 20)
        c = await self.new_run(store, "c", workflow="x", status=RunStatus.WAITING, created_at=now - 10)
        assert [r.run_id for r in await store.list_runs()] == [c.run_id, b.run_id, a.run_id]
        assert [r.run_id for r in await store.list_runs(status=[RunStatus.PENDING])] == [b.run_id]
        pending_or_done = await store.list_runs(status=[RunStatus.PENDING, RunStatus.SUCCEEDED])
        assert {r.run_id for r in pending_or_done} == {a.run_id, b.run_id}
        assert [r.run_id for r in await store.list_runs(workflow="x")] == [c.run_id, a.run_id]
        assert [r.run_id for r in await store.list_runs(workflow="x", status=[RunStatus.WAITING])] == [c.run_id]
        assert [r.run_id for r in await store.list_runs(limit=2)] == [c.run_id, b.run_id]
        assert await store.list_runs(workflow="nobody") == []

    async def test_delete_run_removes_its_journal_events_and_signals_and_is_fenced(self, store: Store) -> None:
        gone = await self.new_run(store, "gone")
        kept = await self.new_run(store, "kept")
        for run in (gone, kept):
            lease = await store.claim(run.run_id, "w1", TTL)
            await store.commit(run.run_id, lease.fence, Commit([_rec("a", "started"), _rec("a")]))
            await store.put_signal(run.run_id, "cb", {"v": 1})
            await store.append_events([Event(run.run_id, "progress", {"message": "m"})])
            await store.release(lease)
        stale = await store.claim(gone.run_id, "w1", TTL)
        current = await store.claim(gone.run_id, "w1", TTL)  # a newer claim: the first lease is stale
        with pytest.raises(LeaseLost):
            await store.delete_run(gone.run_id, fence=stale.fence)
        assert await store.get_run(gone.run_id) is not None and len(await store.load_journal(gone.run_id)) == 2
        assert await store.delete_run(gone.run_id, fence=current.fence) is True
        assert await store.get_run(gone.run_id) is None
        assert await store.load_journal(gone.run_id) == [] and await store.read_events(gone.run_id) == []
        assert await store.get_signals(gone.run_id) == {}
        assert await store.delete_run(gone.run_id) is False  # already gone: nothing to do, no error
        # The other run is untouched.
        assert _shape(await store.load_journal(kept.run_id)) == [("a", "started", None), ("a", "completed", None)]
        assert await store.get_signals(kept.run_id) == {"cb": {"v": 1}}
        assert len(await store.read_events(kept.run_id)) == 1
        assert [r.run_id for r in await store.list_runs()] == [kept.run_id]

    async def test_update_run_changes_fields_and_is_fenced_when_asked(self, store: Store) -> None:
        run = await self.new_run(store)
        await store.update_run(run.run_id, {"cancel_requested": "user asked", "labels": {"k": "v"}})
        got = await store.get_run(run.run_id)
        assert got is not None and got.cancel_requested == "user asked" and got.labels == {"k": "v"}
        assert got.updated_at >= run.updated_at
        old = await store.claim(run.run_id, "w1", TTL)
        new = await store.claim(run.run_id, "w1", TTL)
        with pytest.raises(LeaseLost):
            await store.update_run(run.run_id, {"status": RunStatus.FAILED}, fence=old.fence)
        assert (await store.get_run(run.run_id)).status == RunStatus.PENDING  # type: ignore[union-attr]
        await store.update_run(
            run.run_id,
            {"status": RunStatus.SUCCEEDED, "result": {"ok": True}, "error": ErrorInfo("E", "m", True)},
            fence=new.fence,
        )
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.SUCCEEDED and got.result == {"ok": True}
        assert got.error == ErrorInfo("E", "m", True)

    # ------------------------------------------------------------------ journal

    async def test_commit_is_atomic_and_journal_ordered(self, store: Store) -> None:
        run = await self.new_run(store, thread_id="t-atomic")
        lease = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, lease.fence, Commit([_rec("a", "started")]))
        await store.commit(
            run.run_id,
            lease.fence,
            Commit(
                [_rec("a", "completed", {"v": [1, "x"]}), _rec("b", "started")],
                run={"status": RunStatus.RUNNING, "pending_callbacks": ["cb"], "wake_at": 5.0},
                thread_state=("t-atomic", {"n": 1}),
                cache=("kit-key-" + run.run_id, {"v": 1}, None),
            ),
        )
        rows = await store.load_journal(run.run_id)
        assert _shape(rows) == [("a", "started", None), ("a", "completed", {"v": [1, "x"]}), ("b", "started", None)]
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
        await store.commit(run.run_id, lease.fence, Commit([_rec("big", "completed", big), _rec("small", "completed", 1)]))
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
            recs = [_rec(f"s{i}", "started"), _rec(f"s{i}", "completed", i)]
            await store.commit(run.run_id, lease.fence, Commit(recs))
            await store.commit(other.run_id, other_lease.fence, Commit([_rec(f"o{i}", "completed", -i)]))
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
        await store.commit(run.run_id, old.fence, Commit([_rec("a", "started")]))
        new = await store.claim(run.run_id, "w1", TTL)  # a re-claim moves the fence like a takeover
        assert new.fence > old.fence
        before = _shape(await store.load_journal(run.run_id))
        cache_key = "kit-stale-" + run.run_id
        with pytest.raises(LeaseLost):  # one record
            await store.commit(run.run_id, old.fence, Commit([_rec("a", "completed", 1)]))
        with pytest.raises(LeaseLost):  # everything a commit can carry
            await store.commit(
                run.run_id,
                old.fence,
                Commit(
                    [_rec("a", "completed", 1), _rec("b")],
                    run={"status": RunStatus.SUCCEEDED, "result": 1},
                    thread_state=("t-stale", {"x": 1}),
                    cache=(cache_key, 1, None),
                ),
            )
        with pytest.raises(LeaseLost):  # no records, run changes only
            await store.commit(run.run_id, old.fence, Commit([], run={"status": RunStatus.FAILED}))
        assert _shape(await store.load_journal(run.run_id)) == before
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.PENDING and got.result is None
        assert await store.get_thread_state("t-stale") is None and await store.cache_get(cache_key, 0) is None
        await store.commit(run.run_id, new.fence, Commit([_rec("a", "completed", 2)]))
        assert _shape(await store.load_journal(run.run_id))[-1] == ("a", "completed", 2)

    async def test_commit_to_a_missing_run_raises_lease_lost(self, store: Store) -> None:
        with pytest.raises(LeaseLost):
            await store.commit(self.run_id("missing"), 1, Commit([_rec("a")]))

    async def test_check_cancel_refuses_after_cancel_was_requested(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, lease.fence, Commit([_rec("a", "started")], check_cancel=True))
        await store.update_run(run.run_id, {"cancel_requested": "stop now"})
        with pytest.raises(RunCancelledError) as info:
            await store.commit(run.run_id, lease.fence, Commit([_rec("b", "started")], check_cancel=True))
        assert info.value.reason == "stop now"
        assert [r.op_id for r in await store.load_journal(run.run_id)] == ["a"]
        # Without check_cancel the worker can still record its cleanup and the final status.
        await store.commit(
            run.run_id, lease.fence, Commit([_rec("a", "failed")], run={"status": RunStatus.CANCELLED})
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
        await store.commit(run.run_id, lease.fence, Commit([_rec("c1", "started")], check_cancel=True))
        await store.commit(run.run_id, lease.fence,
                           Commit([_rec("c1", "completed", {"out": 1}), _rec("c2", "started")], check_cancel=True))
        rows = await store.load_journal(run.run_id)
        assert _shape(rows) == [("c1", "started", None), ("c1", "completed", {"out": 1}), ("c2", "started", None)]
        assert rows[0].seq < rows[1].seq < rows[2].seq, "one commit's records keep their order"
        pair = [_rec("c2", "completed", {"out": 2}), _rec("c3", "started")]
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
        assert _shape(rows)[-1] == ("c2", "completed", {"out": 2})
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.CANCELLED

    # ------------------------------------------------------------------ leases

    async def test_claim_takes_a_free_run_and_every_claim_moves_the_fence(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        assert lease.run_id == run.run_id and lease.owner == "w1" and lease.fence > run.fence
        assert lease.expires_at > time.time()
        got = await store.get_run(run.run_id)
        assert got is not None and got.fence == lease.fence and got.lease_owner == "w1"
        with pytest.raises(LeaseHeld) as info:
            await store.claim(run.run_id, "w2", TTL)
        assert info.value.owner == "w1" and "w1" in str(info.value)
        again = await store.claim(run.run_id, "w1", TTL)  # the owner may re-claim; the fence still moves
        assert again.fence > lease.fence
        with pytest.raises(RunNotFound):
            await store.claim(self.run_id("missing"), "w1", TTL)

    async def test_take_over_from_takes_a_lease_only_from_the_named_holder(self, store: Store) -> None:
        run = await self.new_run(store)
        dead = await store.claim(run.run_id, "w1", TTL)
        with pytest.raises(LeaseHeld):
            await store.claim(run.run_id, "w2", TTL, take_over_from="w3")  # not who holds it
        taken = await store.claim(run.run_id, "w2", TTL, take_over_from="w1")  # the holder the caller proved dead
        assert taken.owner == "w2" and taken.fence > dead.fence
        with pytest.raises(LeaseLost):
            await store.renew(dead, TTL)
        with pytest.raises(LeaseHeld):
            await store.claim(run.run_id, "w3", TTL, take_over_from="w1")  # w2 holds it now: never displaced

    async def test_expired_lease_can_be_claimed_and_fences_the_old_holder(self, store: Store) -> None:
        run = await self.new_run(store)
        old = await store.claim(run.run_id, "w1", TTL)
        await self.expire_lease(store, old)
        new = await store.claim(run.run_id, "w2", TTL)
        assert new.owner == "w2" and new.fence > old.fence
        got = await store.get_run(run.run_id)
        assert got is not None and got.lease_owner == "w2" and got.fence == new.fence
        with pytest.raises(LeaseLost):
            await store.commit(run.run_id, old.fence, Commit([_rec("late")]))
        with pytest.raises(LeaseLost):
            await store.renew(old, TTL)

    async def test_renew_extends_only_the_current_lease(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        renewed = await store.renew(lease, 100)
        assert renewed.fence == lease.fence and renewed.owner == "w1"
        assert renewed.expires_at > lease.expires_at
        await store.commit(run.run_id, renewed.fence, Commit([_rec("a")]))  # renewal keeps the fence valid
        newer = await store.claim(run.run_id, "w1", TTL)
        with pytest.raises(LeaseLost):
            await store.renew(lease, TTL)
        await store.renew(newer, TTL)

    async def test_release_frees_the_run_at_once_but_a_stale_release_does_not(self, store: Store) -> None:
        run = await self.new_run(store)
        old = await store.claim(run.run_id, "w1", TTL)
        new = await store.claim(run.run_id, "w1", TTL)  # the holder re-claims: ``old`` is now stale
        await store.release(old)  # stale: must not free the current lease
        with pytest.raises(LeaseHeld):
            await store.claim(run.run_id, "w3", TTL)
        await store.release(new)
        taken = await store.claim(run.run_id, "w3", TTL)  # no waiting for an expiry after a release
        assert taken.owner == "w3" and taken.fence > new.fence
        with pytest.raises(LeaseLost):
            await store.commit(run.run_id, new.fence, Commit([_rec("after-release")]))

    async def test_concurrent_claims_have_one_winner(self, store: Store) -> None:
        run = await self.new_run(store)
        results = await asyncio.gather(
            *(store.claim(run.run_id, f"w{i}", TTL) for i in range(4)), return_exceptions=True
        )
        winners = [r for r in results if isinstance(r, Lease)]
        losers = [r for r in results if not isinstance(r, Lease)]
        assert len(winners) == 1, f"expected exactly one winner, got {results}"
        assert all(isinstance(e, LeaseHeld) for e in losers), losers
        got = await store.get_run(run.run_id)
        assert got is not None and got.fence == winners[0].fence

    # ------------------------------------------------------------------ claim_next

    async def test_claim_next_picks_pending_due_and_orphaned_runs(self, store: Store) -> None:
        now = time.time()
        pending = await self.new_run(store, "pending")
        due = await self.new_run(store, "due", status=RunStatus.WAITING, wake_at=now - 1)
        await self.new_run(store, "not-due", status=RunStatus.WAITING, wake_at=now + 3600)
        await self.new_run(store, "waiting-forever", status=RunStatus.WAITING)
        await self.new_run(store, "suspended", status=RunStatus.SUSPENDED)
        await self.new_run(store, "done", status=RunStatus.SUCCEEDED)
        await self.new_run(store, "failed", status=RunStatus.FAILED)
        await self.new_run(store, "cancelled", status=RunStatus.CANCELLED)
        orphan = await self.new_run(store, "orphan", status=RunStatus.RUNNING)
        busy = await self.new_run(store, "busy", status=RunStatus.RUNNING)
        busy_pending = await self.new_run(store, "busy-pending")
        cancel = await self.new_run(store, "cancel", status=RunStatus.WAITING, cancel_requested="stop")
        dead = await store.claim(orphan.run_id, "dead-worker", TTL)
        await store.claim(busy.run_id, "live-worker", 3600)
        await store.claim(busy_pending.run_id, "live-worker", 3600)
        await self.expire_lease(store, dead)  # the dead worker's lease runs out; the live ones do not

        claimed: dict[str, Lease] = {}
        while (lease := await store.claim_next("me", TTL)) is not None:
            assert lease.owner == "me" and lease.run_id not in claimed, f"claimed {lease.run_id} twice"
            claimed[lease.run_id] = lease
            assert len(claimed) <= 10, "claim_next keeps returning runs"
        assert set(claimed) == {pending.run_id, due.run_id, orphan.run_id, cancel.run_id}
        assert claimed[orphan.run_id].fence > dead.fence
        with pytest.raises(LeaseLost):
            await store.commit(orphan.run_id, dead.fence, Commit([_rec("zombie")]))
        got = await store.get_run(pending.run_id)
        assert got is not None and got.fence == claimed[pending.run_id].fence

    async def test_claim_next_filters_by_workflow(self, store: Store) -> None:
        await self.new_run(store, "a", workflow="alpha")
        b = await self.new_run(store, "b", workflow="beta")
        lease = await store.claim_next("me", TTL, workflows=["beta", "gamma"])
        assert lease is not None and lease.run_id == b.run_id
        assert await store.claim_next("me", TTL, workflows=["beta"]) is None
        assert await store.claim_next("me", TTL, workflows=["gamma"]) is None

    async def test_claim_next_with_nothing_runnable_returns_none(self, store: Store) -> None:
        assert await store.claim_next("me", TTL) is None
        await self.new_run(store, "done", status=RunStatus.SUCCEEDED)
        assert await store.claim_next("me", TTL) is None

    # ------------------------------------------------------------------ signals

    async def test_signals_are_idempotent_for_the_same_value_and_conflict_for_another(self, store: Store) -> None:
        run = await self.new_run(store)
        other = await self.new_run(store, "other")
        assert await store.put_signal(run.run_id, "approve", {"a": 1, "b": [1, 2]}) is True
        assert await store.put_signal(run.run_id, "approve", {"b": [1, 2], "a": 1}) is False  # same value, any key order
        with pytest.raises(SignalConflict):
            await store.put_signal(run.run_id, "approve", {"a": 2})
        assert await store.put_signal(run.run_id, "step/2:ok", None) is True  # ids need not be DNS-safe
        assert await store.put_signal(other.run_id, "approve", "elsewhere") is True
        assert await store.get_signals(run.run_id) == {"approve": {"a": 1, "b": [1, 2]}, "step/2:ok": None}
        assert await store.get_signals(other.run_id) == {"approve": "elsewhere"}

    async def test_concurrent_signals_all_land(self, store: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        await asyncio.gather(
            *(store.put_signal(run.run_id, f"cb-{i}", i) for i in range(8)),
            store.commit(run.run_id, lease.fence, Commit([_rec("x")], run={"status": RunStatus.WAITING})),
        )
        assert await store.get_signals(run.run_id) == {f"cb-{i}": i for i in range(8)}
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.WAITING

    # ------------------------------------------------------------------ events

    async def test_events_are_ordered_per_run(self, store: Store) -> None:
        run = await self.new_run(store)
        other = await self.new_run(store, "other")
        await store.append_events([])
        await store.append_events([Event(run.run_id, "progress", {"message": "hi"}), Event(run.run_id, "run.started")])
        await store.append_events([Event(other.run_id, "run.started")])
        await store.append_events([Event(run.run_id, f"e{i}", {"i": i}) for i in range(5)])
        events = await store.read_events(run.run_id)
        assert [e.type for e in events] == ["progress", "run.started", "e0", "e1", "e2", "e3", "e4"]
        assert events[0].data == {"message": "hi"} and events[2].data == {"i": 0}
        assert all(e.run_id == run.run_id for e in events)
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        assert [e.type for e in await store.read_events(run.run_id, after=events[1].seq)] == [
            "e0", "e1", "e2", "e3", "e4"]
        assert [e.type for e in await store.read_events(run.run_id, after=events[1].seq, limit=2)] == ["e0", "e1"]
        assert await store.read_events(run.run_id, after=events[-1].seq) == []
        assert [e.type for e in await store.read_events(other.run_id)] == ["run.started"]

    async def test_concurrent_event_appends_all_land(self, store: Store) -> None:
        run = await self.new_run(store)
        await asyncio.gather(*(store.append_events([Event(run.run_id, f"e{i}")]) for i in range(6)))
        events = await store.read_events(run.run_id)
        assert sorted(e.type for e in events) == [f"e{i}" for i in range(6)]
        assert len({e.seq for e in events}) == 6

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
        await store.commit(first.run_id, lease.fence, Commit([_rec("a")], thread_state=("t-shared", {"n": 1})))
        assert await store.get_thread_state("t-shared") == {"n": 1}
        lease2 = await store.claim(second.run_id, "w1", TTL)
        await store.commit(second.run_id, lease2.fence, Commit([], thread_state=("t-shared", {"n": 2, "l": [1]})))
        assert await store.get_thread_state("t-shared") == {"n": 2, "l": [1]}
        assert await store.get_thread_state("t-other") is None

    # ------------------------------------------------------------------ two instances (another process's view)

    async def test_a_peer_sees_commits_and_is_fenced(self, store: Store, peer: Store) -> None:
        run = await self.new_run(store)
        lease = await store.claim(run.run_id, "w1", TTL)
        await store.commit(run.run_id, lease.fence, Commit([_rec("a", "completed", 1)], run={"status": RunStatus.RUNNING}))
        assert _shape(await peer.load_journal(run.run_id)) == [("a", "completed", 1)]
        got = await peer.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.RUNNING
        with pytest.raises(LeaseHeld):
            await peer.claim(run.run_id, "w2", TTL)
        await store.release(lease)
        taken = await peer.claim(run.run_id, "w2", TTL)
        with pytest.raises(LeaseLost):
            await store.commit(run.run_id, lease.fence, Commit([_rec("b")]))
        await peer.commit(run.run_id, taken.fence, Commit([_rec("b", "completed", 2)]))
        assert _shape(await store.load_journal(run.run_id)) == [("a", "completed", 1), ("b", "completed", 2)]
        assert await peer.put_signal(run.run_id, "cb", 1) is True
        assert await store.put_signal(run.run_id, "cb", 1) is False
        with pytest.raises(SignalConflict):
            await store.put_signal(run.run_id, "cb", 2)

    async def test_peers_claiming_at_once_have_one_winner(self, store: Store, peer: Store) -> None:
        run = await self.new_run(store)
        results = await asyncio.gather(
            store.claim(run.run_id, "w1", TTL), peer.claim(run.run_id, "w2", TTL), return_exceptions=True
        )
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1 and isinstance(next(r for r in results if not isinstance(r, Lease)), LeaseHeld), results
        loser_store = peer if winners[0].owner == "w1" else store
        got = await loser_store.get_run(run.run_id)
        assert got is not None and got.fence == winners[0].fence

    async def test_peers_claim_next_never_hand_out_a_run_twice(self, store: Store, peer: Store) -> None:
        runs = {(await self.new_run(store, f"batch{i}")).run_id for i in range(6)}

        async def drain(s: Store, owner: str) -> list[str]:
            got: list[str] = []
            while (lease := await s.claim_next(owner, TTL)) is not None:
                got.append(lease.run_id)
            return got

        a, b = await asyncio.gather(drain(store, "w1"), drain(peer, "w2"))
        assert sorted(a + b) == sorted(runs), f"w1 took {a}, w2 took {b}"
