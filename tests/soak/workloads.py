"""Workflow manifests of the soak's scripts, and what their side effects and results must be.

Every execution of a tool call or a step appends its id to the Workflow's effects file on the host (the
local provider and the fake E2B run commands on this machine), so the soak can count executions. A tool call
also appends to ``log.txt`` in its workspace and prints its line count: a result of ``i`` for call ``i`` says
the workspace saw every earlier call exactly once, through sandbox loss, restore and replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.operator_support import manifest
from tests.soak.plan import WorkflowScript

FLOW_ENTRYPOINT = "tests.soak.flows:soak_flow"


def effects_file(effects_dir: Path, script: WorkflowScript) -> Path:
    return effects_dir / f"{script.name}.log"


def gate_file(gates_dir: Path, script: WorkflowScript) -> Path:
    return gates_dir / script.name


def tool_calls(script: WorkflowScript, effects: Path, gate: Path) -> list[dict[str, Any]]:
    calls = []
    for i in range(1, script.calls + 1):
        wait = f"while [ ! -e {gate} ]; do sleep 0.05; done; " if script.gate_at == i - 1 else ""
        calls.append({"type": "shell", "operationId": f"c{i}",
                      "command": f"{wait}echo c{i} >> {effects}; mkdir -p done; touch done/c{i}; ls done | wc -l"})
    return calls


def workflow_manifest(script: WorkflowScript, effects_dir: Path, gates_dir: Path) -> dict[str, Any]:
    effects, gate = effects_file(effects_dir, script), gate_file(gates_dir, script)
    if script.kind == "flow":
        return manifest(script.name, entrypoint=FLOW_ENTRYPOINT, toolCalls=None, sandbox=None, snapshotEveryNCalls=None,
                        input={"effects": str(effects), "nap_seconds": script.nap_seconds, "provider": script.provider})
    sandbox: dict[str, Any] = {"provider": script.provider}
    if script.provider == "e2b":
        sandbox["template"] = "base"
    return manifest(script.name, toolCalls=tool_calls(script, effects, gate), sandbox=sandbox,
                    snapshotEveryNCalls=script.snapshot_every, injectLossAfterNCalls=script.loss_after,
                    retainLatestSnapshot=script.retain or None)


def effect_order(script: WorkflowScript) -> list[str]:
    """The side-effect tokens of a Workflow in the order its run executes them."""
    if script.kind == "flow":
        return ["s1", "s2", "w1", "w2", "s3"]
    return [f"c{i}" for i in range(1, script.calls + 1)]


def signal_value(script: WorkflowScript) -> dict[str, Any]:
    return {"approved": True, "by": script.name}


def expected_result_problems(script: WorkflowScript, result: dict[str, Any]) -> list[str]:
    """What is wrong with a succeeded Workflow's status.result, given its script."""
    if script.kind == "flow":
        want: dict[str, Any] = {"steps": ["s1", "s2", "s3"], "approval": signal_value(script),
                                "work": "w1\nw2\n"}
        return [f"result.{k} is {result.get(k)!r}, expected {v!r}" for k, v in want.items() if result.get(k) != v]
    outs = [r.get("stdout") for r in result.get("toolResults") or []]
    want_outs = [f"{i}\n" for i in range(1, script.calls + 1)]
    if outs != want_outs:
        return [f"tool results' stdout {outs!r}, expected {want_outs!r} (each call once in the workspace)"]
    return []
