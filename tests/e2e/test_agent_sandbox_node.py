"""kubernetes-sigs/agent-sandbox's own flow on the test node (issue 37, slice 1), before anything of ours runs on it.

Its controller (scripts/agent-sandbox-build, v1.0.1 from the Go module proxy) runs beside the node as its
ServiceAccount under the RBAC it ships (agent_sandbox_support.py). A SandboxTemplate and a SandboxWarmPool of one
fill the pool with a Ready sandbox; a SandboxClaim on the pool becomes Ready on that warm Pod (adopted, not a new
one), and a command runs in it through the API server's exec. The image is the node tests' busybox (built locally
from the host's static busybox), not their python runtime image: this test proves their controllers' flow, which
does not depend on what the Pod runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .agent_sandbox_support import AgentSandbox, run_agent_sandbox
from .controlplane import fresh_namespace
from .node_support import NodeCluster, busybox_image

EXT = "extensions.agents.x-k8s.io/v1beta1"
READY_TIMEOUT_S = 120.0
GONE_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def agent_sandbox(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentSandbox]:
    with run_agent_sandbox(node_cluster, tmp_path_factory.mktemp("agent-sandbox")) as controller:
        yield controller


@pytest.fixture
def namespace(node_cluster: NodeCluster) -> Iterator[str]:
    with fresh_namespace(node_cluster, "agent-sandbox") as ns:
        yield ns


def template(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": EXT, "kind": "SandboxTemplate", "metadata": {"name": name}, "spec": {
        "podTemplate": {"spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": image, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", "echo ready > /tmp/ready; exec sleep 3600"]}]}}}}


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for condition in obj.get("status", {}).get("conditions", []):
        if condition["type"] == kind:
            return str(condition["status"])
    return None


def _pods(cluster: NodeCluster, namespace: str) -> dict[str, str]:
    """The namespace's Pods: name -> uid."""
    listed = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    return {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in listed}


def test_a_claim_on_a_warm_pool_becomes_ready_on_a_warm_pod_and_runs_a_command(
        node_cluster: NodeCluster, agent_sandbox: AgentSandbox, namespace: str) -> None:
    started = time.monotonic()
    image = busybox_image(node_cluster)
    ns = ("-n", namespace)
    node_cluster.apply(template("busybox", image), *ns)
    node_cluster.apply({"apiVersion": EXT, "kind": "SandboxWarmPool", "metadata": {"name": "warm"},
                        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "busybox"}}}, *ns)

    def pool_ready() -> bool:
        assert agent_sandbox.alive(), f"agent-sandbox's controller exited:\n{agent_sandbox.tail()}"
        pool = node_cluster.kubectl_json("get", "sandboxwarmpool", "warm", *ns)
        return int(pool.get("status", {}).get("readyReplicas", 0)) == 1

    node_cluster.wait_until(pool_ready, READY_TIMEOUT_S, "the warm pool's sandbox to be Ready")
    warm = _pods(node_cluster, namespace)
    assert len(warm) == 1, warm
    pool_filled = time.monotonic()

    node_cluster.apply({"apiVersion": EXT, "kind": "SandboxClaim", "metadata": {"name": "mine"},
                        "spec": {"warmPoolRef": {"name": "warm"}}}, *ns)

    def claim_ready() -> bool:
        assert agent_sandbox.alive(), f"agent-sandbox's controller exited:\n{agent_sandbox.tail()}"
        claim = node_cluster.kubectl_json("get", "sandboxclaim", "mine", *ns)
        return _condition(claim, "Ready") == "True"

    node_cluster.wait_until(claim_ready, READY_TIMEOUT_S, "the claim to be Ready")
    claimed = time.monotonic()
    claim = node_cluster.kubectl_json("get", "sandboxclaim", "mine", *ns)
    sandbox_name = claim["status"]["sandbox"]["name"]
    sandbox = node_cluster.kubectl_json("get", "sandbox", sandbox_name, *ns)
    assert _condition(sandbox, "Ready") == "True", sandbox.get("status")
    pod = sandbox["metadata"].get("annotations", {}).get("agents.x-k8s.io/pod-name", sandbox_name)
    assert pod in warm, f"the claim's Pod {pod} is not the warm pool's {sorted(warm)}: it was not adopted"

    done = node_cluster.kubectl("exec", *ns, pod, "--", "/bin/sh", "-c", "cat /tmp/ready; echo $((6 * 7))")
    assert done.stdout.split() == ["ready", "42"], done.stdout

    # The pool refills behind the claim: one more Pod, the claimed one kept.
    node_cluster.wait_until(pool_ready, READY_TIMEOUT_S, "the warm pool to refill")
    assert pod in _pods(node_cluster, namespace)

    # Deleting the claim ends its sandbox and Pod (their owner references), and nothing else of the pool's.
    node_cluster.kubectl("delete", "sandboxclaim", "mine", *ns)
    node_cluster.wait_until(lambda: warm[pod] not in _pods(node_cluster, namespace).values(), GONE_TIMEOUT_S,
                            "the claimed Pod to be deleted with its claim")
    assert node_cluster.kubectl("get", "sandbox", sandbox_name, *ns, check=False).returncode != 0
    print(f"\nagent-sandbox: pool filled in {pool_filled - started:.1f}s, claim Ready in {claimed - pool_filled:.1f}s")


def test_its_controller_runs_under_the_rbac_it_ships(node_cluster: NodeCluster, agent_sandbox: AgentSandbox) -> None:
    """The controller's kubeconfig impersonates its ServiceAccount, so the test above ran under its own ClusterRoles:
    that account may manage Sandboxes, Pods and its claims' status, and may not read Secrets or grant itself more."""
    account = "system:serviceaccount:agent-sandbox-system:agent-sandbox-controller"
    kubeconfig = Path(agent_sandbox.log.parent / "controller.kubeconfig")
    assert f"as: {account}" in kubeconfig.read_text()

    def can(verb: str, resource: str, *extra: str) -> str:
        return node_cluster.kubectl("auth", "can-i", verb, resource, "-A", *extra, as_user=account,
                                    check=False).stdout.strip()

    assert can("create", "sandboxes.agents.x-k8s.io") == "yes"
    assert can("create", "pods") == "yes"
    assert can("update", "sandboxclaims.extensions.agents.x-k8s.io", "--subresource=status") == "yes"
    assert can("get", "secrets") == "no"
    assert can("create", "clusterrolebindings.rbac.authorization.k8s.io") == "no"
