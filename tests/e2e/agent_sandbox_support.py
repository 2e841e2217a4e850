"""kubernetes-sigs/agent-sandbox's own controller beside the test node (issue 37), for the tests that run on it.

scripts/agent-sandbox-build builds the controller from the Go module ``sigs.k8s.io/agent-sandbox`` and keeps the
module's ``k8s/`` manifests beside it. :func:`run_agent_sandbox` applies its CRDs and its RBAC as shipped (the
ClusterRoles, the ServiceAccount and its bindings; not its Deployment: the node has no image of it) and runs the
controller as a host process with ``-extensions`` (claims, templates, warm pools), out of cluster like any
controller-runtime manager. It talks to the API server *as its ServiceAccount* (a kubeconfig that impersonates
it), so the RBAC it ships is what it runs under, as in a real install. The CRDs and RBAC are removed after it.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.processes import stop_process

from .controlplane import PROJECT_ROOT, wait_until
from .node_support import NodeCluster, _script_output

AGENT_SANDBOX_SCRIPT = PROJECT_ROOT / "scripts" / "agent-sandbox-build"
# Its k8s/controller.yaml and k8s/extensions.yaml: the ServiceAccount the shipped bindings name.
CONTROLLER_NAMESPACE = "agent-sandbox-system"
CONTROLLER_ACCOUNT = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:agent-sandbox-controller"
# What of its manifests applies to a controller that is not a Deployment in the cluster.
RBAC_KINDS = frozenset({"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})
RBAC_FILES = ("controller.yaml", "rbac.generated.yaml", "extensions.yaml", "extensions-rbac.generated.yaml")
READY_TIMEOUT_S = 60.0
DELETE_TIMEOUT_S = 180.0
API_GROUPS = ("agents.x-k8s.io", "extensions.agents.x-k8s.io")


def agent_sandbox_build() -> Path:
    """scripts/agent-sandbox-build's cache directory (controller binary, k8s/), once per session (the e2e conftest
    builds it outside any test)."""
    return _script_output(AGENT_SANDBOX_SCRIPT)


def rbac_manifests(k8s: Path) -> list[dict[str, Any]]:
    """The RBAC objects (and their namespace and ServiceAccount) of the module's k8s/ manifests."""
    kept: list[dict[str, Any]] = []
    for name in RBAC_FILES:
        for doc in yaml.safe_load_all((k8s / name).read_text()):
            if isinstance(doc, dict) and doc.get("kind") in RBAC_KINDS:
                kept.append(doc)
    return kept


def impersonating_kubeconfig(kubeconfig: Path, user: str, target: Path) -> Path:
    """A copy of ``kubeconfig`` whose every user acts as ``user`` (client-go honours a kubeconfig's ``as``)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config.get("users", []):
        entry["user"]["as"] = user
    target.write_text(yaml.safe_dump(config))
    target.chmod(0o600)
    return target


@dataclass
class AgentSandbox:
    """agent-sandbox's controller running against the node; ``log`` is its output."""

    process: subprocess.Popen[bytes]
    log: Path
    k8s: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:]) if self.log.exists() else ""


def _established(cluster: NodeCluster, crds: list[str]) -> bool:
    for crd in crds:
        done = cluster.kubectl("get", "crd", crd, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                               check=False)
        if done.stdout.strip() != "True":
            return False
    return True


@contextlib.contextmanager
def run_agent_sandbox(cluster: NodeCluster, workdir: Path) -> Iterator[AgentSandbox]:
    """agent-sandbox (CRDs, RBAC, controller) on ``cluster`` until the block ends; then the controller is stopped
    and its CRDs (with every object of theirs) and RBAC are deleted."""
    build = agent_sandbox_build()
    k8s = build / "k8s"
    crd_files = sorted((k8s / "crds").glob("*.yaml"))
    crds = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in crd_files]
    manifests = rbac_manifests(k8s)
    rbac = yaml.safe_dump_all(manifests)
    namespaces = sorted({m["metadata"]["name"] for m in manifests if m.get("kind") == "Namespace"})
    # An earlier module's agent-sandbox is deleted without waiting (its teardown): its namespace may still be
    # terminating, and nothing can be created in it until it is gone (CI: every test of the next module erred).
    wait_until(lambda: not _terminating(cluster, namespaces, crds), DELETE_TIMEOUT_S,
               "an earlier agent-sandbox's namespace and CRDs to finish deleting")
    for path in crd_files:
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    cluster.kubectl("apply", "-f", "-", input=rbac)
    log = workdir / "agent-sandbox-controller.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: _established(cluster, crds), READY_TIMEOUT_S, "agent-sandbox's CRDs to be established")
        kubeconfig = impersonating_kubeconfig(cluster.kubeconfig, CONTROLLER_ACCOUNT, workdir / "controller.kubeconfig")
        with log.open("ab") as out:
            # No leader election (one controller), metrics and probes off (ports others on this machine may hold).
            process = subprocess.Popen(
                [str(build / "agent-sandbox-controller"), f"--kubeconfig={kubeconfig}", "--extensions",
                 "--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        yield AgentSandbox(process, log, k8s)
    finally:
        if process is not None:
            stop_process(process, timeout=30)
        # Its controller sets no finalizers (v1.0.1), so deleting a CRD takes every object of its kind along;
        # the Pods and Services those made are owned by them and the garbage collector removes them.
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=rbac, check=False)
        for path in crd_files:
            cluster.kubectl("delete", "-f", str(path), "--ignore-not-found", "--wait=false", check=False)


def _terminating(cluster: NodeCluster, namespaces: list[str], crds: list[str]) -> bool:
    """Whether any of ``namespaces`` or ``crds`` is still being deleted."""
    for kind, names in (("namespace", namespaces), ("crd", crds)):
        for name in names:
            found = cluster.kubectl("get", kind, name, "-o", "jsonpath={.metadata.deletionTimestamp}",
                                    "--ignore-not-found", check=False)
            if found.returncode == 0 and found.stdout.strip():
                return True
    return False
