"""Continue-as-new on SQLite (the cases: tests/unit/continue_as_new_cases.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_sandbox.engine.store import Store
from durable_sandbox.stores import SqliteStore
from tests.unit.continue_as_new_cases import ContinueAsNewCases


class TestContinueAsNewSqlite(ContinueAsNewCases):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        self.location = str(tmp_path / "runs.db")
        s = SqliteStore(self.location)
        yield s
        await s.close()
