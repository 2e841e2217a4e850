"""Continue-as-new on SQLite (the cases: tests/unit/continue_as_new_cases.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durable_sandbox
from durable_sandbox.engine.store import CommitsWithNewRun, Store
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.stores import SqliteStore
from tests.unit.child_workflow_cases import lines
from tests.unit.composition_flows import counter
from tests.unit.continue_as_new_cases import ContinueAsNewCases


class TestContinueAsNewSqlite(ContinueAsNewCases):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        self.location = str(tmp_path / "runs.db")
        s = SqliteStore(self.location)
        yield s
        await s.close()


class _SeparateCreate:
    """A store without ``commit_with_new_run`` (as a third party's may be): the engine creates the next run apart."""

    def __init__(self, inner: SqliteStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "commit_with_new_run":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_a_store_without_commit_with_new_run_still_chains(tmp_path: Path) -> None:
    sqlite = SqliteStore(tmp_path / "runs.db")
    store: Any = _SeparateCreate(sqlite)
    assert isinstance(sqlite, CommitsWithNewRun) and not isinstance(store, CommitsWithNewRun)
    engine = durable_sandbox.Engine(store, providers={"local": LocalProvider(tmp_path / "home")})
    try:
        st = await engine.run(counter, {"log": str(tmp_path / "log"), "rounds": 3}, run_id="sep")
        assert st.run_id == "sep~2" and st.status == "succeeded" and st.result == {"counted": 3}
        assert lines(tmp_path / "log") == ["count:0", "count:1", "count:2"]
    finally:
        await engine.aclose()
        await sqlite.close()
