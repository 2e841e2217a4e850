"""Issue 39, first slice, against a real API server: a Workflow with spec.worker waits for a worker (and says so),
a `dsb worker --kube` process with a namespace ServiceAccount's token runs it, a worker SIGKILLed mid-run is
taken over by another with no committed step run again, deleting the Workflow with no worker alive deletes its
sandboxes, a worker of namespace A can neither read, write, claim nor seal the runs of namespace B, and what it
forges in its own journal cannot make the operator delete B's sandbox; and (second slice) a run started by one
build of the worker is left alone by a worker of another build, the Workflow naming the build it waits for."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    OperatorProcess,
    condition,
    local_sandboxes,
    namespace,
    operators,
    status,
    wait_condition,
    wait_gone,
)
from tests.e2e.worker_support import WorkerProcess, forge_provision, grant_worker, queued

__all__ = ["namespace", "operators"]  # fixtures

pytestmark = pytest.mark.apiserver_journal(
    "worker Workflows need the API-server journal in this slice: a worker opens its namespace's Journal objects with "
    "the worker key; with PostgreSQL there is no key to hand and no per-namespace database role yet (issue 39)")

STEPS = "tests.e2e.worker_support:gated_steps"
GATE_FLOW = "examples.flows.approval_gate:approval_gate"


@dataclass
class Team:
    cp: ControlPlane
    a: str
    b: str
    op: OperatorProcess
    tmp: Path
    workers: list[WorkerProcess]

    def worker(self, ns: str | None = None, *, as_ns: str | None = None, build: str | None = None) -> WorkerProcess:
        """A worker of namespace ``ns`` (default A) with the token of ``as_ns``'s ServiceAccount (default: its own),
        of build ``build`` (default: unversioned)."""
        ns = ns or self.a
        w = WorkerProcess(self.tmp / f"worker-{as_ns or ns}.kubeconfig", ns, self.op.home,
                          self.tmp / f"worker-{len(self.workers) + 1}.log")
        self.workers.append(w)
        return w.start(*(("--build-id", build) if build else ()))

    def apply(self, ns: str, doc: dict[str, Any]) -> None:
        self.cp.apply(doc, "-n", ns)

    def lines(self, name: str) -> list[str]:
        path = self.tmp / f"{name}.effects"
        return path.read_text().split() if path.exists() else []


@pytest.fixture
def team(control_plane: ControlPlane, namespace: str, operators: Any, tmp_path: Path) -> Iterator[Team]:
    cp = control_plane
    b = f"team-b-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", b)
    grant_worker(cp, namespace, tmp_path / f"worker-{namespace}.kubeconfig")
    grant_worker(cp, b, tmp_path / f"worker-{b}.kubeconfig")
    op = operators("--allow-local-provider", "--namespace", b)  # no --workflows: it imports no worker code
    t = Team(cp, namespace, b, op, tmp_path, [])
    try:
        yield t
    finally:
        for w in t.workers:
            w.stop()
        cp.kubectl("delete", "namespace", b, "--wait=false", "--ignore-not-found", check=False)


def test_a_worker_workflow_waits_for_a_worker_then_a_namespace_worker_runs_it(team: Team) -> None:
    t = team
    t.apply(t.a, queued("steps", STEPS, {"effects": str(t.tmp / "steps.effects"), "steps": 3}))
    wait_condition(t.cp, t.a, "steps", "WaitingForWorker", timeout=60)
    waiting = condition(t.cp, t.a, "steps", "WaitingForWorker")
    assert waiting is not None and waiting["reason"] == "NoWorker"
    assert "queue 'agents'" in waiting["message"] and t.a in waiting["message"], waiting
    assert status(t.cp, t.a, "steps")["phase"] == "Pending"
    secret = t.cp.kubectl_json("get", "secret", "durable-sandbox-worker-key", "-n", t.a)  # handed by the operator
    assert secret["data"]["key"]

    t.worker()
    wait_condition(t.cp, t.a, "steps", "Succeeded", timeout=120)
    st = status(t.cp, t.a, "steps")
    assert st["result"] == {"done": [0, 1, 2]}
    assert t.lines("steps") == ["s0", "s1", "s2"]
    done = condition(t.cp, t.a, "steps", "WaitingForWorker")
    assert done is not None and done["status"] == "False"
    t.op.check_log()


def test_a_worker_killed_mid_run_is_taken_over_without_running_a_committed_step_again(team: Team) -> None:
    t = team
    gate = t.tmp / "gate"
    t.apply(t.a, queued("killed", STEPS, {"effects": str(t.tmp / "killed.effects"), "steps": 4,
                                          "gate": str(gate), "gateAt": 2}))
    first = t.worker()
    wait_until(lambda: t.lines("killed") == ["s0", "s1", "s2-waiting"], 120,
               f"step s2 to be in flight (effects {t.lines('killed')}; worker log {first.logs()[-2000:]})")
    first.kill()  # SIGKILL: s0 and s1 are committed, s2 started
    gate.touch()
    t.worker()
    wait_condition(t.cp, t.a, "killed", "Succeeded", timeout=120)
    assert status(t.cp, t.a, "killed")["result"] == {"done": [0, 1, 2, 3]}
    lines = t.lines("killed")
    assert lines.count("s0") == 1 and lines.count("s1") == 1, lines  # committed: never again
    assert lines.count("s2") == 1 and lines.count("s3") == 1, lines


def test_a_run_pinned_to_the_build_that_started_it_waits_for_that_build_through_a_rolling_update(team: Team) -> None:
    t = team
    gate = t.tmp / "pin-gate"
    t.apply(t.a, queued("pinned", STEPS, {"effects": str(t.tmp / "pinned.effects"), "steps": 3,
                                          "gate": str(gate), "gateAt": 1}))
    old = t.worker(build="v1")
    wait_until(lambda: t.lines("pinned") == ["s0", "s1-waiting"], 120,
               f"step s1 to be in flight (effects {t.lines('pinned')}; worker log {old.logs()[-2000:]})")
    old.kill()  # the old build's Pod is gone mid-step; only the new build runs
    gate.touch()
    new = t.worker(build="v2")

    def says_pinned() -> bool:
        c = condition(t.cp, t.a, "pinned", "WaitingForWorker")
        return c is not None and c["status"] == "True" and "pinned to build 'v1'" in c["message"]

    wait_until(says_pinned, 90, f"WaitingForWorker to name build v1 (worker log {new.logs()[-2000:]})")
    assert "v2" in (condition(t.cp, t.a, "pinned", "WaitingForWorker") or {})["message"]
    wait_until(lambda: "pinned to build 'v1'" in new.logs(), 30, "the v2 worker to say it leaves the run alone")
    assert t.lines("pinned") == ["s0", "s1-waiting"]  # the v2 worker ran none of it

    t.worker(build="v1")  # a worker of the run's build (the old Deployment kept, or scaled back up)
    wait_condition(t.cp, t.a, "pinned", "Succeeded", timeout=120)
    assert status(t.cp, t.a, "pinned")["result"] == {"done": [0, 1, 2]}
    lines = t.lines("pinned")
    assert lines.count("s0") == 1 and lines.count("s2") == 1, lines


def test_deleting_a_worker_workflow_with_no_worker_alive_deletes_its_sandboxes(team: Team) -> None:
    t = team
    t.apply(t.a, queued("held", GATE_FLOW, {"name": "held", "hibernateAfterSeconds": 600}))
    w = t.worker()
    wait_condition(t.cp, t.a, "held", "WaitingForSignal", timeout=120)
    workspaces = [s for s in local_sandboxes(t.op.home) if s.startswith("local/workspaces/")]
    assert len(workspaces) == 1, local_sandboxes(t.op.home)
    w.kill()  # no worker left
    t.cp.kubectl("delete", "workflow", "held", "-n", t.a, "--wait=false")
    wait_gone(t.cp, t.a, "held", timeout=120)
    assert [s for s in local_sandboxes(t.op.home) if s.startswith("local/workspaces/")] == []


def test_a_worker_of_namespace_a_cannot_read_write_claim_or_seal_namespace_b_runs(team: Team) -> None:
    t = team
    t.apply(t.b, queued("b-run", STEPS, {"effects": str(t.tmp / "b.effects"), "steps": 2}))
    wait_condition(t.cp, t.b, "b-run", "WaitingForWorker", timeout=60)
    run_id = status(t.cp, t.b, "b-run")["runId"]

    # Its credentials: refused by the API server in B, visibly.
    kubeconfig = str(t.tmp / f"worker-{t.a}.kubeconfig")
    for args in (("get", "journals", "-n", t.b), ("get", "secret", "durable-sandbox-worker-key", "-n", t.b),
                 ("get", "workflows", "-n", t.b)):
        proc = t.cp.kubectl(*args, f"--kubeconfig={kubeconfig}", check=False)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), (args, proc.stderr)
    forged = {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Journal",
              "metadata": {"name": "dsb.forged", "namespace": t.b}, "data": {"run.status": '"succeeded"'}}
    proc = t.cp.kubectl("create", "-f", "-", f"--kubeconfig={kubeconfig}", input=json.dumps(forged), check=False)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr

    # As a worker of B: it cannot even read B's key, and says what is wrong.
    hostile = t.worker(t.b, as_ns=t.a)
    assert hostile.process is not None and hostile.process.wait(timeout=60) != 0
    assert "durable-sandbox-worker-key" in hostile.logs() and "Traceback" not in hostile.logs(), hostile.logs()

    # B's run is untouched: still waiting for B's own worker, which then runs it.
    assert status(t.cp, t.b, "b-run")["phase"] == "Pending" and not t.lines("b")
    t.worker(t.b)
    wait_condition(t.cp, t.b, "b-run", "Succeeded", timeout=120)
    assert status(t.cp, t.b, "b-run")["runId"] == run_id and t.lines("b") == ["s0", "s1"]


def test_a_record_a_worker_forges_in_its_own_journal_cannot_make_the_operator_delete_another_namespace_sandbox(
        team: Team) -> None:
    t = team
    for ns, name in ((t.b, "b-held"), (t.a, "a-held")):
        t.apply(ns, queued(name, GATE_FLOW, {"name": name, "hibernateAfterSeconds": 600}))
        w = t.worker(ns)
        wait_condition(t.cp, ns, name, "WaitingForSignal", timeout=120)
        w.kill()
    b_sandbox = status(t.cp, t.b, "b-held")["sandbox"]["providerId"]
    a_sandbox = status(t.cp, t.a, "a-held")["sandbox"]["providerId"]
    assert f"local/workspaces/{b_sandbox}" in local_sandboxes(t.op.home)

    # Worker A, with its own token and key, seals into its own run a provision record naming B's sandbox.
    run_id = status(t.cp, t.a, "a-held")["runId"]
    asyncio.run(forge_provision(t.tmp / f"worker-{t.a}.kubeconfig", t.a, run_id, a_sandbox, b_sandbox))

    t.cp.kubectl("delete", "workflow", "a-held", "-n", t.a, "--wait=false")
    wait_gone(t.cp, t.a, "a-held", timeout=120)
    left = local_sandboxes(t.op.home)
    assert f"local/workspaces/{a_sandbox}" not in left  # A's own, by its owner tag
    assert f"local/workspaces/{b_sandbox}" in left, left  # B's: never by A's word
    assert status(t.cp, t.b, "b-held")["phase"] == "Waiting"
