"""The soak tier: every test here is marked ``soak`` and ``e2e`` (it needs the real control plane, so
``-m "not e2e"`` leaves it out with the rest of that tier; ``-m soak`` selects it alone)."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.controlplane import build_controlplane
from tests.fakes.fixtures import fake_e2b_in_thread
from tests.soak.driver import FakeE2B
from tests.soak.plan import FAULT_KINDS, FaultKind
from tests.soak.settings import SoakSettings

SOAK_DIR = Path(__file__).resolve().parent
CI_WORKFLOWS = 30
CI_FAULTS_PER_KIND = 10


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SOAK_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.soak)
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session: pytest.Session) -> None:
    # As the e2e tier does (tests/e2e/conftest.py), outside any test's timeout; a no-op once built.
    if session.config.option.collectonly or not any(i.get_closest_marker("soak") for i in session.items):
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        with contextlib.suppress(RuntimeError):  # remembered; the control_plane fixture raises it
            build_controlplane()




def _setting(config: pytest.Config, option: str, env: str) -> int | None:
    value = config.getoption(option)
    if value is None and os.environ.get(env):
        value = int(os.environ[env])
    return value


@pytest.fixture
def soak_settings(request: pytest.FixtureRequest) -> SoakSettings:
    workflows = _setting(request.config, "--soak-workflows", "DSB_SOAK_WORKFLOWS")
    seed = _setting(request.config, "--soak-seed", "DSB_SOAK_SEED")
    return SoakSettings(
        seed=seed if seed is not None else random.randrange(1 << 31),
        workflows=workflows or CI_WORKFLOWS,
        faults_per_kind=_setting(request.config, "--soak-faults", "DSB_SOAK_FAULTS") or CI_FAULTS_PER_KIND,
        fault_kinds=_kinds(request.config.getoption("--soak-fault-kinds") or os.environ.get("DSB_SOAK_FAULT_KINDS")),
    )


def _kinds(raw: str | None) -> tuple[FaultKind, ...]:
    if not raw:
        return FAULT_KINDS  # --soak-fault-kinds picks fewer, e.g. to replay a seed
    kinds = tuple(k.strip() for k in raw.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise pytest.UsageError(f"--soak-fault-kinds: unknown fault kind(s) {unknown}; known: {', '.join(FAULT_KINDS)}")
    return kinds  # type: ignore[return-value]


@pytest.fixture
def soak_e2b(tmp_path: Path) -> Iterator[FakeE2B]:
    """The fake E2B server on an event loop thread of its own (the soak's loop blocks on kubectl)."""
    with fake_e2b_in_thread(tmp_path / "fake-e2b") as (state, loop):
        yield FakeE2B(state, loop)
