"""The soak driver spreads its Workflows over its faults: applied as fast as they ran, they all ended while an API
server restart still had faults left, and those had nothing to hit (a CI failure, seed 1749772400)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.soak.driver import Soak
from tests.soak.plan import make_plan


class _Applies:
    def __init__(self) -> None:
        self.applied: list[str] = []

    def apply(self, manifest: Any, *args: str) -> None:
        self.applied.append(str(manifest)[:20])


def _soak(tmp_path: Path, workflows: int = 30) -> tuple[Soak, _Applies]:
    cp = _Applies()
    plan = make_plan(seed=7, workflows=workflows, faults_per_kind=10)
    soak = Soak(plan=plan, cp=cp, namespace="ns", apiserver=None, fake=None, operators=[],  # type: ignore[arg-type]
                effects_dir=tmp_path / "e", gates_dir=tmp_path / "g", max_active=10, log=lambda _: None)
    return soak, cp


def _finish_all_applied(soak: Soak) -> None:
    for t in soak.tracked.values():
        if t.applied:
            t.done = True


def test_workflows_beyond_the_first_batch_wait_for_faults(tmp_path: Path) -> None:
    soak, cp = _soak(tmp_path)
    soak.apply_more()
    assert len(cp.applied) == 10
    # Every applied Workflow ended, no fault injected yet: only as many as the faults left need to run.
    _finish_all_applied(soak)
    soak.apply_more()
    active = [t for t in soak.tracked.values() if t.applied and not t.done]
    assert active, "faults need side effects: one Workflow at least must run"
    assert any(t.script.provider == "e2b" for t in active), "e2b faults are left: one Workflow on e2b must run"
    assert len(cp.applied) < 20


def test_the_limit_grows_with_the_faults_injected_and_reaches_every_workflow(tmp_path: Path) -> None:
    soak, _ = _soak(tmp_path)
    assert soak.paced_limit() == 10
    kinds = list(soak.injected)
    half = len(soak.plan.faults) // 2
    for i in range(half):
        soak.injected[kinds[i % len(kinds)]] += 1
    assert soak.paced_limit() == 10 + 10  # half of the 20 held back
    for i in range(half, len(soak.plan.faults)):
        soak.injected[kinds[i % len(kinds)]] += 1
    assert soak.paced_limit() == 30


def test_once_the_faults_are_all_in_every_workflow_is_applied(tmp_path: Path) -> None:
    soak, cp = _soak(tmp_path)
    for fault in soak.plan.faults:
        soak.injected[fault.kind] += 1
    while len(cp.applied) < 30:
        before = len(cp.applied)
        soak.apply_more()
        assert len(cp.applied) > before
        _finish_all_applied(soak)
