"""examples/worker: the team module the example image ships runs as a workflow of its own (a fresh run takes the
path its ctx.patched guards), it is declared auto-upgrade, and the Dockerfile gives the image the build id the
worker advertises ($DSB_BUILD_ID, engine/builds.py) and imports the module at build time."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from durable_sandbox.engine import Engine
from durable_sandbox.engine.builds import BUILD_ENV
from durable_sandbox.engine.workflow import definition_of
from durable_sandbox.stores import SqliteStore
from tests.dsb import ROOT

EXAMPLE = ROOT / "examples" / "worker"


@pytest.fixture
def team_flows(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield importlib.import_module("team_flows")
    sys.modules.pop("team_flows", None)


async def test_the_example_team_workflow_runs_and_is_auto_upgrade(team_flows: ModuleType, store: SqliteStore) -> None:
    assert definition_of(team_flows.triage).versioning == "auto-upgrade"
    engine = Engine(store, worker_id="example", lease_ttl=10.0)
    try:
        st = await engine.run(team_flows.triage, {"text": "URGENT: error on login"}, run_id="t1")
    finally:
        await engine.aclose()
    assert st.status == "succeeded" and st.result == {"label": "bug", "queue": "oncall-urgent"}
    assert [o.op_id for o in st.operations] == ["classify", "patch:priority", "route-priority"]


def test_the_example_dockerfile_sets_the_build_id_and_imports_the_team_module() -> None:
    lines = [line.strip() for line in (EXAMPLE / "Dockerfile").read_text().splitlines() if not line.startswith("#")]
    assert "ARG BUILD_ID" in lines and f"ENV {BUILD_ENV}=${{BUILD_ID}}" in lines
    assert any(line.startswith("COPY") and "team_flows" in line for line in lines)
    assert 'RUN python3 -c "import team_flows"' in lines
    assert 'ENTRYPOINT ["dsb", "worker", "--kube"]' in lines
