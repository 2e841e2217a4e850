"""Issue 13, acceptance 5: with `dsb operator --max-concurrent-runs 5` and 50 Workflows applied at once, at most
5 execute at any moment on the replica, the rest show phase Pending with Ready=False reason ConcurrencyLimit, and
all 50 finish.

Measured from the side-effect log, not from timing: every Workflow's one tool call appends ``start <name>`` to a
shared file, then blocks until the test opens a gate file, then appends ``end <name>``. With the gate shut the
replica must hold exactly 5 runs inside their call while the other 45 report that they wait for a slot; the
log's start/end order then bounds the overlap over the whole batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import manifest, namespace, operators

__all__ = ["namespace", "operators"]  # fixtures

CAP = 5
WORKFLOWS = 50


def _gated_call(name: str, log: Path, gate: Path) -> dict[str, Any]:
    # Appends to one file are atomic at these sizes, so the file's line order is the order of events.
    command = (f'echo "start {name}" >> {log}; while [ ! -e {gate} ]; do sleep 0.05; done; '
               f'echo "end {name}" >> {log}')
    return {"type": "shell", "command": command}


def _lines(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines() if line]  # type: ignore[misc]


def _workflows(cp: ControlPlane, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.kubectl_json("get", "workflows", "-n", ns).get("items", [])
    return items


def _ready(wf: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (wf.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})


def test_the_cap_holds_runs_beyond_it_pending_with_the_reason_and_all_finish(
    control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path
) -> None:
    log, gate = tmp_path / "side-effects.log", tmp_path / "gate"
    names = [f"capped-{i:02d}" for i in range(WORKFLOWS)]
    batch = tmp_path / "batch.yaml"
    batch.write_text(yaml.safe_dump_all(
        manifest(name, snapshotEveryNCalls=None, toolCalls=[_gated_call(name, log, gate)]) for name in names
    ))
    operators("--allow-local-provider", "--max-concurrent-runs", str(CAP))
    control_plane.kubectl("apply", "-n", namespace, "-f", str(batch))

    # Gate shut: exactly CAP runs are inside their call and every other one says it waits for a slot.
    def held() -> tuple[list[str], list[dict[str, Any]]] | None:
        started = [name for event, name in _lines(log) if event == "start"]
        queued = [wf for wf in _workflows(control_plane, namespace)
                  if (wf.get("status") or {}).get("phase") == "Pending" and _ready(wf).get("reason") == "ConcurrencyLimit"]
        return (started, queued) if len(started) == CAP and len(queued) == WORKFLOWS - CAP else None

    try:
        started, queued = wait_until(held, 240, f"{CAP} runs in their call and {WORKFLOWS - CAP} Pending (ConcurrencyLimit)")
    except TimeoutError as exc:
        phases = sorted(((wf["metadata"]["name"], (wf.get("status") or {}).get("phase"), _ready(wf).get("reason"))
                         for wf in _workflows(control_plane, namespace)), key=str)
        raise AssertionError(f"{exc}; log: {_lines(log)}; workflows: {phases}") from None
    assert {wf["metadata"]["name"] for wf in queued}.isdisjoint(started)
    message = _ready(queued[0])["message"]
    assert f"--max-concurrent-runs {CAP}" in message and "queued here" in message, message

    gate.touch()

    def finished() -> bool:
        return all((wf.get("status") or {}).get("phase") == "Succeeded" for wf in _workflows(control_plane, namespace))

    wait_until(finished, 300, f"all {WORKFLOWS} Workflows to succeed")

    # The whole batch, from the side-effect log: every call ran once, and never more than CAP at a time.
    events = _lines(log)
    assert sorted(name for event, name in events if event == "start") == names
    assert sorted(name for event, name in events if event == "end") == names
    depth = most = 0
    for event, _ in events:
        depth += 1 if event == "start" else -1
        most = max(most, depth)
    assert most == CAP, f"at most {CAP} runs may execute at once; the log shows {most}"
    assert all(_ready(wf).get("reason") != "ConcurrencyLimit" for wf in _workflows(control_plane, namespace))
