"""Shared fixtures for the unit tier: an isolated DURABLE_SANDBOX_HOME, a SqliteStore and an Engine on
tmp_path, and a controllable clock for TTLs, timers and leases (no sleeps standing in for time)."""

from __future__ import annotations

import time
import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import durable_sandbox.engine.context as context_mod
import durable_sandbox.engine.driver as driver_mod
import durable_sandbox.engine.executor as executor_mod
import durable_sandbox.stores.sqlite as sqlite_mod
from durable_sandbox.engine import Engine
from durable_sandbox.stores import SqliteStore

_real_time = time.time


@pytest.fixture(autouse=True)
def durable_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own DURABLE_SANDBOX_HOME (inherited by child processes) and no fault spec."""
    home = tmp_path / "dsb-home"
    home.mkdir()
    monkeypatch.setenv("DURABLE_SANDBOX_HOME", str(home))
    monkeypatch.delenv("DURABLE_SANDBOX_FAULT", raising=False)
    return home


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


class Clock:
    """Wall clock seen by the engine context, runtime and SqliteStore: real time plus an offset."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return _real_time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    fake = types.SimpleNamespace(
        time=c.time, monotonic=time.monotonic, sleep=time.sleep, perf_counter=time.perf_counter
    )
    for mod in (context_mod, driver_mod, executor_mod, sqlite_mod):
        monkeypatch.setattr(mod, "time", fake)
    return c
