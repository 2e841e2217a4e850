"""Fixtures and options shared by every tier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.clock import Clock
from tests.fakes.fixtures import fake_e2b
from tests.postgres.fixtures import install_if_selected, mark_postgres_tests, postgres_dsn, postgres_server

__all__ = ["clock", "control_plane", "fake_e2b", "postgres_dsn", "postgres_server", "s3_server"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_postgres_tests(items)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-p no:xdist` still runs the suite in one process
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """scripts/test's ``--dist loadgroup``: whole modules to a worker, the node's modules as one group
    (tests/worker_groups.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.worker_groups import ModuleScheduling

    return ModuleScheduling(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    install_if_selected(session)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("e2e", "the e2e tier (tests/e2e, docs/testing.md)").addoption(
        "--operator-journal", choices=["apiserver", "postgres"], default=None,
        help="The journal of every operator the e2e harness starts (default apiserver; env DSB_TEST_OPERATOR_JOURNAL)")
    group = parser.getgroup("soak", "the chaos soak (tests/soak, docs/reliability.md)")
    group.addoption("--soak-workflows", type=int, default=None,
                    help="Workflows in the soak (default 30, the CI version; env DSB_SOAK_WORKFLOWS)")
    group.addoption("--soak-seed", type=int, default=None,
                    help="Seed of the soak's plan and fault schedule (default random, printed; env DSB_SOAK_SEED)")
    group.addoption("--soak-faults", type=int, default=None,
                    help="Injected faults of each kind (default 10; env DSB_SOAK_FAULTS)")
    group.addoption("--soak-fault-kinds", default=None,
                    help="Comma-separated fault kinds (default: all but apiserver-restart; env DSB_SOAK_FAULT_KINDS)")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real control plane (tests/e2e/controlplane.py), one per session for the e2e tier and the soak."""
    from tests.e2e.controlplane import session_control_plane

    yield from session_control_plane(tmp_path_factory)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The wall clock of the engine's context, executor and run driver and of SqliteStore, moved by the test
    (``clock.advance``): TTLs, leases, timers and backoffs pass without waiting."""
    return Clock().install(monkeypatch)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3-compatible store (versitygw, tests/objectstore.py) on loopback, one per session."""
    from tests.objectstore import S3Server, install_versitygw

    root = tmp_path_factory.mktemp("s3")
    server = S3Server(binary=install_versitygw(), data=root / "data", log=root / "versitygw.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
