"""The example flows in examples/flows are tests too: each runs here against a SqliteStore in tmp_path
(DURABLE_SANDBOX_HOME is tmp_path, see conftest), and the side-effect log shows what really ran."""

from __future__ import annotations

import json
import os
import shlex
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
from tests.dsb import dsb
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


def _planner_children(stage: str, ids: list[str]) -> list[str]:
    return [f"{stage}-{i}" for i in ids]


async def _each_child_had_its_own_sandbox(engine: durable_sandbox.Engine, parent: str, children: list[str]) -> None:
    sandboxes = set()
    for child_op in children:
        rows = await engine.history(f"{parent}.{child_op}")
        provisions = [r.result["id"] for r in rows if r.kind == "sandbox.provision" and r.status == "completed"]
        saves = [r.op_id for r in rows if r.kind == "sandbox.call" and r.status == "completed"]
        assert len(provisions) >= 1 and saves == ["workspace/save-draft", "workspace/save-final"], (child_op, rows)
        sandboxes.update(provisions)
    assert len(sandboxes) >= len(children)  # no two children shared one


async def test_planner_delegates_each_package_to_a_child_and_repeats_only_the_failed_one(
    eng: durable_sandbox.Engine, tmp_path: Path
) -> None:
    log = str(tmp_path / "planner.log")
    params = {"goal": "billing page", "areas": ["api", "ui", "data"], "log": log,
              "fail_once": ["ui"], "marker_dir": str(tmp_path)}
    st = await eng.run(planner, params, run_id="p1")
    assert st.status == RunStatus.FAILED
    assert st.error is not None and "p1.specialists-ui" in st.error["message"]

    st = await eng.resume("p1")  # retry the failed run: the failed child is retried as the same run
    assert st.status == RunStatus.SUCCEEDED, st.error
    assert st.result == {"goal": "billing page", "packages": ["api", "data", "docs", "security", "ui"],
                         "gapsFilled": ["docs", "security"]}
    ran = Counter(_effects.stages(log))
    # Every stage ran once, but the draft of the specialist that failed (its failed attempt, then its retry).
    assert ran == Counter({"plan": 1, "critic": 1, "draft:ui": 2, **{f"{s}:{p}": 1 for s in ("draft", "polish")
                                                                     for p in ("api", "data", "docs", "security")},
                           "polish:ui": 1}), ran
    runs = {r.run_id: r.status for r in await eng.runs()}
    children = _planner_children("specialists", ["api", "ui", "data"]) + _planner_children("gap-fill",
                                                                                           ["docs", "security"])
    assert runs == {"p1": RunStatus.SUCCEEDED, **{f"p1.{c}": RunStatus.SUCCEEDED for c in children}}
    await _each_child_had_its_own_sandbox(eng, "p1", children)


@pytest.mark.parametrize("fault", ["after:critic", "after:polish@2"])
async def test_planner_resumed_after_sigkill_runs_no_completed_child_again(tmp_path: Path, fault: str) -> None:
    """SIGKILLed once the first children and the critic are done (``after:critic``), or in the middle of the
    fan-out, right after the second specialist's polish landed (``after:polish@2``): resumed by ``dsb resume``,
    the run does only the missing work: no completed step of any child runs again, nor the plan or the critic."""
    db, log = tmp_path / "runs.db", str(tmp_path / "planner.log")
    data = json.dumps({"goal": "billing page", "log": log})
    killed = dsb("--store", str(db), "run", "examples.flows.planner:planner", "--input", data, "--run-id", "k1",
                 fault=fault)
    assert killed.exit_code == -9, killed.output[-3000:]
    before = _effects.stages(log)
    polished = await _landed(db, "k1", ["api", "ui", "data"])  # a step whose effect ran but did not land may run again
    assert before.count("plan") == 1 and len(polished) in ((3,) if fault == "after:critic" else (2, 3)), before

    resumed = dsb("--store", str(db), "resume", "k1", process=True)
    assert resumed.exit_code == 0, resumed.output[-3000:]
    after = _effects.stages(log)[len(before):]
    assert "plan" not in after and after.count("critic") == (0 if "critic" in before else 1), after
    for package in polished:  # a child whose work had landed: nothing of it ran again
        assert f"draft:{package}" not in after and f"polish:{package}" not in after, (package, before, after)
    ran = Counter(before + after)
    assert all(ran[f"polish:{p}"] == 1 for p in polished | {"docs", "security"}), ran
    store = SqliteStore(db)
    engine = durable_sandbox.Engine(store, worker_id="test")
    try:
        st = await engine.inspect("k1")
        assert st.status == RunStatus.SUCCEEDED, st.error
        assert st.result == {"goal": "billing page", "packages": ["api", "data", "docs", "security", "ui"],
                             "gapsFilled": ["docs", "security"]}
        await _each_child_had_its_own_sandbox(engine, "k1", _planner_children("specialists", ["api", "ui", "data"]))
    finally:
        await engine.aclose()
        await store.close()


async def _landed(db: Path, parent: str, packages: list[str]) -> set[str]:
    """The packages whose specialist's ``polish`` step is journaled completed (its work landed)."""
    store = SqliteStore(db)
    try:
        return {p for p in packages
                if any(r.op_id == "polish" and r.status == "completed"
                       for r in await store.load_journal(f"{parent}.specialists-{p}"))}
    finally:
        await store.close()


def test_planner_docstring_command_runs(tmp_path: Path) -> None:
    import examples.flows.planner as module

    command = next(line.strip() for line in (module.__doc__ or "").splitlines() if line.strip().startswith("dsb run"))
    args = shlex.split(command)[1:]
    ran = dsb("--store", str(tmp_path / "runs.db"), "-o", "json", *args, process=True)
    assert ran.exit_code == 0, ran.output[-3000:]
    state = json.loads(ran.stdout)
    assert state["status"] == "succeeded" and state["result"]["packages"] == ["api", "data", "docs", "security", "ui"]


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


async def test_rolling_session_continues_as_new_in_one_sandbox(eng: durable_sandbox.Engine) -> None:
    from examples.flows.rolling_session import rolling_session

    state = await eng.run(rolling_session, {"total": 5, "perRun": 2}, run_id="roll")
    assert state.status == RunStatus.SUCCEEDED and state.run_id == "roll~2"  # three runs: 2 + 2 + 1 calls
    assert state.result["calls"] == [f"call-{i}" for i in range(5)]
    assert len(state.result["sandboxes"]) == 3 and len(set(state.result["sandboxes"])) == 1  # never re-provisioned
