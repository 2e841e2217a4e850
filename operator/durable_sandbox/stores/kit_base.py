"""The store contract kit's fixtures, hooks and helpers, shared by its case groups (``stores/testing.py``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from durable_sandbox.engine.records import Lease, OperationRecord, RunRecord
from durable_sandbox.engine.store import Store

__all__ = ["TTL", "StoreKit", "rec", "shape"]

TTL = 30.0


def rec(op_id: str, status: str = "completed", result: Any = None, **kw: Any) -> OperationRecord:
    """A journal record of a step, completed unless told."""
    return OperationRecord(op_id, "step", "fn", status, 1, "digest", result, **kw)


def shape(rows: list[OperationRecord]) -> list[tuple[str, str, Any]]:
    """What a test compares of journal rows: (op_id, status, result)."""
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
