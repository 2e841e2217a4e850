"""Shared fixtures for the unit tier: an isolated DURABLE_SANDBOX_HOME, a SqliteStore and an Engine on
tmp_path. (The controllable ``clock`` is every tier's: tests/conftest.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_sandbox.engine import Engine
from durable_sandbox.stores import SqliteStore
from tests.dsb import ROOT


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own DURABLE_SANDBOX_HOME (inherited by child processes: `dsb`'s default store and
    the local provider's sandboxes are there), no fault spec, and the repository root as the working
    directory, so ``module:function`` targets (``tests.unit.cli_flows:...``) resolve as under ``python -m``."""
    path = tmp_path / "dsb-home"
    path.mkdir()
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(path))
    monkeypatch.delenv("DURABLE_SANDBOX_FAULT", raising=False)
    monkeypatch.chdir(ROOT)
    return path


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(db_path)
    yield s
    await s.close()


@pytest.fixture
async def engine(store: SqliteStore) -> AsyncIterator[Engine]:
    e = Engine(store, worker_id="test-worker", lease_ttl=10.0)
    yield e
    await e.aclose()
