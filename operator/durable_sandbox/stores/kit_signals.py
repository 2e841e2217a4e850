"""The store contract kit's cases of signals (``stores/testing.py``)."""

from __future__ import annotations

import asyncio

import pytest

from durable_sandbox.engine.errors import SignalConflict
from durable_sandbox.engine.records import Commit, RunStatus
from durable_sandbox.engine.store import Store
from durable_sandbox.stores.kit_base import TTL, StoreKit, rec

__all__ = ["SignalCases"]


class SignalCases(StoreKit):
    """Signals are idempotent for the same value and conflict for another one."""

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
            store.commit(run.run_id, lease.fence, Commit([rec("x")], run={"status": RunStatus.WAITING})),
        )
        assert await store.get_signals(run.run_id) == {f"cb-{i}": i for i in range(8)}
        got = await store.get_run(run.run_id)
        assert got is not None and got.status == RunStatus.WAITING
