"""One manifest, one meaning: the same Workflows run through `dsb run` (no cluster) and through the operator
(a real API server) end alike, field by field: phase, attempts, result and error.

The cases are the run policy's (engine/driver.py): success, a nonzero exit that fails the run under
``failurePolicy``, ``timeoutSeconds`` (a bound from creation, across attempts: cancelled), ``retry`` (the
first attempt fails, the second succeeds) and ``cancel``. Each manifest differs between the two places only
in the path of the marker file its flaky call leaves behind (both run on this machine); operation ids are
given, so the results can be compared whole (but for the sandbox's provider id, which every sandbox has
its own of)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import yaml

from durable_sandbox.engine import RunStatus
from durable_sandbox.kube.reporting.status import PHASES, TERMINAL_PHASES
from tests import builders
from tests.dsb import dsb
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import namespace, operators, status

__all__ = ["namespace", "operators"]  # fixtures


def shell(operation_id: str, command: str, **fields: Any) -> dict[str, Any]:
    return {"type": "shell", "operationId": operation_id, "command": command, **fields}


def cases(marker: Path, never: Path) -> dict[str, dict[str, Any]]:
    """The spec of each case; ``marker`` is where the flaky call remembers its first attempt."""
    return {
        "succeeds": {"toolCalls": [
            {"type": "write_file", "operationId": "note", "path": "note.txt", "contents": "hello\n"},
            shell("read", "cat note.txt; ls missing"),  # a nonzero exit is a completed call by default
        ]},
        "fails-by-policy": {"toolCalls": [
            shell("ok", "echo before"),
            shell("fails", "echo nope; exit 3", failurePolicy={"onNonZeroExit": "fail"}),
            shell("never-reached", "echo after"),
        ]},
        "times-out": {"timeoutSeconds": 3, "retry": {"maxAttempts": 3, "initialIntervalSeconds": 30},
                      "toolCalls": [shell("waits", f"while [ ! -e {never} ]; do sleep 0.05; done")]},
        "retries": {"retry": {"maxAttempts": 2, "initialIntervalSeconds": 1}, "toolCalls": [
            shell("before", "echo before"),
            shell("flaky", f"if [ -e {marker} ]; then echo recovered; else touch {marker}; exit 7; fi",
                  failurePolicy={"onNonZeroExit": "fail"}),
        ]},
        "cancelled": {"cancel": True, "toolCalls": [shell("never-run", "echo hi")]},
    }


def workflow(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return builders.workflow(name, **{"sandbox": {"provider": "local"}, **spec})


def outcome(phase: str, attempt: Any, result: Any, error: Any) -> dict[str, Any]:
    """What is compared: the result without the sandbox's provider id, the error's type and message. A field
    whose value is null is left out: status is written with merge patches, in which a null deletes the field."""
    if isinstance(result, dict):
        result = {k: v for k, v in result.items() if k != "sandboxId" and v is not None}
    return {"phase": phase, "attempt": attempt, "result": result,
            "error": {"type": error["type"], "message": error["message"]} if error else None}


def run_locally(tmp_path: Path, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(workflow(name, spec)))
    proc = dsb("--store", str(tmp_path / "runs.db"), "-o", "json", "run", str(path),
               env={"DURABLE_SANDBOX_HOME": str(tmp_path / "local-home")}, timeout=300, process=True)
    assert proc.returncode in (0, 1), f"dsb run {name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    doc = json.loads(proc.stdout)
    return outcome(PHASES[RunStatus(doc["status"])], doc["attempt"], doc["result"], doc["error"])


def run_in_cluster(cp: ControlPlane, ns: str, names: list[str]) -> dict[str, dict[str, Any]]:
    def settled(name: str) -> dict[str, Any] | None:
        st = status(cp, ns, name)
        return st if st.get("phase") in TERMINAL_PHASES else None

    out = {}
    for name in names:
        st = wait_until(functools.partial(settled, name), 240, f"workflow {ns}/{name} to finish")
        out[name] = outcome(st["phase"], st.get("attempt"), st.get("result"), st.get("error"))
    return out


def test_the_same_manifests_end_alike_under_dsb_run_and_the_operator(
        control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> None:
    local_dir, cluster_dir = tmp_path / "local", tmp_path / "cluster"
    local_dir.mkdir()
    cluster_dir.mkdir()
    never = tmp_path / "never"
    operators("--allow-local-provider")
    in_cluster = cases(cluster_dir / "marker", never)
    for name, spec in in_cluster.items():
        control_plane.apply(workflow(name, spec), "-n", namespace)
    local = {name: run_locally(local_dir, name, spec) for name, spec in cases(local_dir / "marker", never).items()}
    cluster = run_in_cluster(control_plane, namespace, list(in_cluster))

    assert not os.path.exists(never)
    expected_phases = {"succeeds": "Succeeded", "fails-by-policy": "Failed", "times-out": "Cancelled",
                       "retries": "Succeeded", "cancelled": "Cancelled"}
    assert {n: o["phase"] for n, o in local.items()} == expected_phases
    assert local["retries"]["attempt"] == 2 and local["times-out"]["attempt"] == 1
    assert local["times-out"]["error"]["message"] == "timed out after 3s (spec.timeoutSeconds)"
    differences = {name: {"dsb run": local[name], "operator": cluster[name]}
                   for name in local if local[name] != cluster[name]}
    assert not differences, json.dumps(differences, indent=2, sort_keys=True)
