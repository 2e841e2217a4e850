"""Worker-executed Workflows against a real API server (issue 39): the flows a team's worker imports, the worker's
Role, a worker process started with a namespace ServiceAccount's token."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import durable_sandbox
from tests.dsb import DSB, ROOT
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import sa_kubeconfig

__all__ = ["WORKER_RULES", "WorkerProcess", "forge_provision", "gated_steps", "grant_worker", "queued"]

QUEUE = "agents"
WORKER_RULES: list[dict[str, Any]] = [  # docs/kubernetes.md, "Your own workers": the worker's Role
    {"apiGroups": ["durable-sandbox.dev"], "resources": ["workflows"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["durable-sandbox.dev"], "resources": ["journals"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "create", "update", "delete"]},
    {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["durable-sandbox-worker-key"], "verbs": ["get"]},
]


def _append(path: str, line: str) -> None:
    with Path(path).open("a") as f:
        f.write(line + "\n")


def _exists(path: str) -> bool:
    return Path(path).exists()


async def _mark(effects: str, i: int, gate: str | None) -> int:
    """Step ``i``'s side effect: ``s<i>`` in the effects log once it completes; the gated step first writes
    ``s<i>-waiting`` and waits for the gate file (the test kills the worker meanwhile)."""
    if gate is not None:
        _append(effects, f"s{i}-waiting")
        while not _exists(gate):  # noqa: ASYNC110 - another process opens it: there is no event to wait on
            await asyncio.sleep(0.05)
    _append(effects, f"s{i}")
    return i


@durable_sandbox.workflow(name="e2e-worker-gated-steps")
async def gated_steps(ctx: durable_sandbox.Context, inp: dict[str, Any]) -> dict[str, Any]:
    done: list[int] = []
    for i in range(int(inp["steps"])):
        gate = inp.get("gate") if i == inp.get("gateAt") else None
        done.append(await ctx.step(f"s{i}", _mark, inp["effects"], i, gate))
    return {"done": done}


def queued(name: str, entrypoint: str, inp: dict[str, Any], queue: str = QUEUE) -> dict[str, Any]:
    return {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
            "spec": {"entrypoint": entrypoint, "input": inp, "worker": {"queue": queue}}}


def grant_worker(cp: ControlPlane, namespace: str, kubeconfig: Path) -> None:
    """ServiceAccount ``worker`` of ``namespace`` with the worker's Role there, and a kubeconfig of its token."""
    cp.kubectl("create", "serviceaccount", "worker", "-n", namespace)
    cp.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
              "metadata": {"name": "dsb-worker", "namespace": namespace}, "rules": WORKER_RULES})
    cp.kubectl("create", "rolebinding", "dsb-worker", "-n", namespace, "--role=dsb-worker",
               f"--serviceaccount={namespace}:worker")
    wait_until(lambda: cp.kubectl("auth", "can-i", "create", "journals.durable-sandbox.dev", "-n", namespace,
                                  f"--as=system:serviceaccount:{namespace}:worker", check=False).returncode == 0,
               30, "the worker's RoleBinding to take effect")
    sa_kubeconfig(cp, namespace, "worker", kubeconfig)


@dataclass
class WorkerProcess:
    """``dsb worker --kube --queue QUEUE -n NS`` with the kubeconfig of a namespace ServiceAccount."""

    kubeconfig: Path
    namespace: str
    home: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> WorkerProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "DURABLE_SANDBOX_HOME": str(self.home),
               "PYTHONUNBUFFERED": "1"}
        env.pop("DURABLE_SANDBOX_FAULT", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [DSB, "worker", "--kube", "--queue", QUEUE, "-n", self.namespace, "--poll-interval", "0.2",
                 "--lease-seconds", "6", *extra],  # as the operators' (operator_support.py): a kill costs 6 s, not 15
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT), start_new_session=True)
        return self

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 60) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


async def forge_provision(kubeconfig: Path, namespace: str, run_id: str, own_id: str, stolen_id: str) -> None:
    """What a hostile worker can do with its credentials and its namespace's key: append to its own run's journal,
    under the run's Lease, a sealed ``sandbox.provision`` record of a session ``stolen`` naming ``stolen_id``."""
    from durable_sandbox.engine.records import Commit
    from durable_sandbox.kube.api.client import KubeClient
    from durable_sandbox.kube.journal.worker_key import read_worker_key
    from durable_sandbox.kube.store import KubernetesStore

    async with await KubeClient.connect(kubeconfig=str(kubeconfig)) as api:
        store = KubernetesStore(namespace, api, namespace_key=await read_worker_key(api, namespace))
        provision = next(r for r in await store.load_journal(run_id) if r.kind == "sandbox.provision" and r.result)
        forged = dataclasses.replace(
            provision, op_id=provision.op_id.replace("workspace", "stolen", 1), seq=0,
            result=json.loads(json.dumps(provision.result).replace(own_id, stolen_id)),
            meta=json.loads(json.dumps(provision.meta).replace(own_id, stolen_id)))
        lease = await store.claim(run_id, "hostile-worker", 30)
        await store.commit(run_id, lease.fence, Commit(records=[forged]))
        await store.release(lease)
        rows = await store.load_journal(run_id)
        assert any(stolen_id in json.dumps([r.result, r.meta]) for r in rows), [(r.op_id, r.result, r.meta) for r in rows]
