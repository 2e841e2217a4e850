"""The example flows in examples/flows are tests too: each runs here against a SqliteStore in tmp_path
(DURABLE_SANDBOX_HOME is tmp_path, see conftest), and the side-effect log shows what really ran."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from examples.flows import _effects
from examples.flows.cicd import cicd
from examples.flows.planner import planner

import durable_sandbox
from durable_sandbox.engine import RunStatus
from durable_sandbox.stores import SqliteStore
from tests.unit.lease_support import wait_for_lease_expiry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def eng(tmp_path: Path) -> Any:
    store = SqliteStore(tmp_path / "runs.db")
    engine = durable_sandbox.Engine(store, worker_id="test-worker", lease_ttl=10.0)
    yield engine
    await engine.aclose()
    await store.close()


def child(*args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DURABLE_SANDBOX_FAULT", None)
    if fault:
        env["DURABLE_SANDBOX_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tests.unit.flows_support", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------- cicd


async def test_cicd_in_process_with_rework_approval_and_health(eng: durable_sandbox.Engine, tmp_path: Path) -> None:
    log = str(tmp_path / "cicd.log")
    st = await eng.run(cicd, {"change": "add /healthz", "log": log, "failing_checks": 2}, run_id="c1")
    assert st.status == RunStatus.WAITING and [p.id for p in st.pending_callbacks] == ["approve"]
    assert sorted(_effects.stages(log)[:4]) == ["design", "implement", "review", "tests"]
    assert _effects.stages(log)[4:] == ["checks-0", "rework-0", "checks-1", "rework-1", "checks-2"]
    await eng.signal("c1", "approve", {"approved": True, "by": "lead"})
    st = await eng.resume("c1")
    assert st.status == RunStatus.WAITING and [p.id for p in st.pending_callbacks] == ["integration-health"]
    await eng.signal("c1", "integration-health", {"healthy": False})
    st = await eng.resume("c1")
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"status": "rolled-back", "release": "rel-c0ffee1", "rolledBack": "rel-c0ffee1"}
    assert max(Counter(_effects.stages(log)).values()) == 1  # every stage ran exactly once


async def test_cicd_resumes_on_a_second_worker_process_after_sigkill(tmp_path: Path) -> None:
    db, log = str(tmp_path / "runs.db"), str(tmp_path / "cicd.log")
    data = f'{{"change": "add /healthz", "log": "{log}"}}'
    # Worker 1: the approval is signalled before the run reaches it (kept and delivered then); the process
    # is SIGKILLed right after the deploy step is committed.
    first = child("start", db, "examples.flows.cicd:cicd", "k1", data, 'approve={"approved": true, "by": "lead"}',
                  fault="after:deploy")
    assert first.returncode == -9, first.stderr[-3000:]
    before = _effects.stages(log)
    assert before[-1] == "deploy" and len({e["pid"] for e in _effects.read(log)}) == 1

    await wait_for_lease_expiry(db, "k1")  # worker 1 is dead; its lease must run out
    second = child("worker", db)
    assert second.returncode == 0, second.stderr[-3000:]
    store = SqliteStore(db)
    engine = durable_sandbox.Engine(store, worker_id="test")
    try:
        st = await engine.inspect("k1")
        assert st.status == RunStatus.WAITING and [p.id for p in st.pending_callbacks] == ["integration-health"]
        assert _effects.stages(log) == before  # worker 2 replayed every completed stage, repeated none
        await engine.signal("k1", "integration-health", {"healthy": True})
        st = await engine.resume("k1")
    finally:
        await engine.aclose()
        await store.close()
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"status": "released", "release": "rel-c0ffee1", "reworkRounds": 1}
    assert Counter(_effects.stages(log))["deploy"] == 1


# ---------------------------------------------------------------------- planner


async def test_planner_fills_gaps_and_repeats_only_the_failed_branch(eng: durable_sandbox.Engine, tmp_path: Path) -> None:
    log = str(tmp_path / "planner.log")
    params = {"goal": "billing page", "areas": ["api", "ui", "data"], "log": log,
              "fail_once": ["ui"], "marker_dir": str(tmp_path)}
    st = await eng.run(planner, params, run_id="p1")
    assert st.status == RunStatus.FAILED
    assert st.error is not None and "ui" in st.error["message"]
    first = _effects.stages(log)
    assert first.count("plan") == 1 and "polish:api" in first and "polish:data" in first and "polish:ui" not in first

    st = await eng.resume("p1")  # retry the failed run
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"goal": "billing page", "packages": ["api", "data", "docs", "security", "ui"],
                         "gapsFilled": ["docs", "security"]}
    again = _effects.stages(log)[len(first):]
    # only the failed specialist re-ran, then the critic and the gap fill; the planner and finished branches did not
    assert again[:2] == ["draft:ui", "polish:ui"]
    assert again[2] == "critic"
    assert sorted(again[3:]) == ["draft:docs", "draft:security", "polish:docs", "polish:security"]


# ---------------------------------------------------------------------- security finding


@pytest.mark.parametrize("severity", ["high", "low"])
async def test_security_finding(eng: durable_sandbox.Engine, tmp_path: Path, severity: str) -> None:
    pytest.importorskip("strands")
    from examples.flows.security_finding import remediate

    log = str(tmp_path / "sec.log")
    st = await eng.run(remediate, {"id": "SEC-7", "severity": severity, "log": log}, run_id="s1")
    if severity == "high":
        assert st.status == RunStatus.WAITING and [p.id for p in st.pending_callbacks] == ["approve-fix"]
        assert "canary-deploy" not in _effects.stages(log)
        await eng.signal("s1", "approve-fix", {"approved": True, "by": "security-lead"})
        st = await eng.resume("s1")
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result["status"] == "closed" and st.result["checkBefore"] == 1 and st.result["checkAfter"] == 0
    assert st.result["approvedBy"] == ("security-lead" if severity == "high" else "policy:auto")
    stages = _effects.stages(log)
    # the agent's model and tools ran once; the resume replayed them from the journal
    assert [s for s in stages if s.startswith("agent:")] == [
        "agent:model-0", "agent:inspect_code", "agent:model-1", "agent:propose_patch", "agent:model-2",
    ]
    assert stages[-4:] == ["canary-deploy", "canary-verify", "promote", "close"]
    ids = {o.op_id for o in st.operations}
    assert {"coder/model/1", "coder/tool/1-inspect_code", "coder/tool/2-propose_patch", "reviews/security"} <= ids
    assert any(o.kind == "sandbox.destroy" for o in st.operations)  # the workspace was cleaned up


# ---------------------------------------------------------------------- every code sample in the docs works


def _doc_blocks() -> list[str]:
    text = (ROOT / "docs" / "workflows.md").read_text()
    return [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]


@pytest.mark.parametrize("index", range(len(_doc_blocks())))
def test_docs_workflows_code_samples_run(index: int, tmp_path: Path) -> None:
    block = _doc_blocks()[index]
    if "from strands" in block:  # needs the agents extra, as the other strands tests do
        pytest.importorskip("strands", reason="this docs sample uses strands-agents (pip install -e '.[agents]')")
    script = tmp_path / f"sample_{index}.py"
    script.write_text(block)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DURABLE_SANDBOX_FAULT", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
