"""The ``agent-sandbox`` provider on kubernetes-sigs/agent-sandbox's real controller (issue 37 item 2, acceptance):
the provider contract kit against it, and a Workflow with ``provider: agent-sandbox`` whose claim is deleted by hand
mid-run (Succeeded, the same results as an undisturbed twin, no claim or snapshot left once both are deleted).

agent-sandbox v1.0.1 runs beside the test node under the RBAC it ships (agent_sandbox_support.py); each test's
namespace gets a SandboxTemplate of the node tests' busybox image and a SandboxWarmPool of it, which the claims name.
Snapshots go to the session's S3 server (versitygw on loopback). Short by design (node time is CI time): the kit's
sandboxes come warm from the pool, and the Workflow test runs its two Workflows side by side.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from durable_sandbox.providers.agent_sandbox import AgentSandboxProvider
from durable_sandbox.providers.agent_sandbox_settings import AgentSandboxSettings
from durable_sandbox.providers.contract import ProvisionError, SandboxHandle, SandboxProvider
from durable_sandbox.providers.s3_snapshots import S3SnapshotStore
from durable_sandbox.providers.testing import ContractResources, ProviderContractSuite
from durable_sandbox.testing import FakeClock
from tests.e2e.controlplane import ControlPlane, fresh_namespace, wait_until
from tests.e2e.kubernetes_operator_support import Cluster, cluster
from tests.e2e.operator_support import namespace, operators, status, wait_condition, wait_gone, wait_in_flight
from tests.e2e.sandbox_support import control_plane_on_the_node, node, sandbox_image
from tests.objectstore import S3Server

from .agent_sandbox_support import AgentSandbox, run_agent_sandbox
from .node_support import NodeCluster

__all__ = ["cluster", "control_plane_on_the_node", "namespace", "node", "operators"]  # fixtures

EXT = "extensions.agents.x-k8s.io/v1beta1"
POOL = "warm"
READY_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def agent_sandbox(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentSandbox]:
    with run_agent_sandbox(node_cluster, tmp_path_factory.mktemp("agent-sandbox")) as controller:
        yield controller


def warm_pool(cp: NodeCluster, namespace: str, controller: AgentSandbox, replicas: int) -> None:
    """A SandboxTemplate of the busybox image and a SandboxWarmPool of ``replicas`` of it, Ready."""
    cp.apply({"apiVersion": EXT, "kind": "SandboxTemplate", "metadata": {"name": "busybox"}, "spec": {
        "podTemplate": {"spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": sandbox_image(cp), "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", "exec sleep 36000"]}]}}}}, "-n", namespace)
    cp.apply({"apiVersion": EXT, "kind": "SandboxWarmPool", "metadata": {"name": POOL},
              "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "busybox"}}}, "-n", namespace)

    def ready() -> bool:
        assert controller.alive(), f"agent-sandbox's controller exited:\n{controller.tail()}"
        pool = cp.kubectl_json("get", "sandboxwarmpool", POOL, "-n", namespace)
        return int(pool.get("status", {}).get("readyReplicas", 0)) >= replicas

    wait_until(ready, READY_TIMEOUT_S, "the warm pool to be Ready")


def claims(cp: ControlPlane, namespace: str) -> list[str]:
    items = cp.kubectl_json("get", "sandboxclaims", "-n", namespace)["items"]
    return [c["metadata"]["name"] for c in items if not c["metadata"].get("deletionTimestamp")]


@pytest.fixture(scope="module")
def warm_namespace(node_cluster: NodeCluster, agent_sandbox: AgentSandbox) -> Iterator[str]:
    """One namespace with the warm pool for the module's kit cases (the pool refills behind each claim)."""
    with fresh_namespace(node_cluster, "asp") as ns:
        warm_pool(node_cluster, ns, agent_sandbox, replicas=2)
        yield ns


@pytest.fixture
def pool_namespace(node_cluster: NodeCluster, warm_namespace: str) -> Iterator[str]:
    yield warm_namespace
    left = claims(node_cluster, warm_namespace)
    assert left == [], f"the test left SandboxClaims behind: {left}"


@pytest.fixture
async def store(s3_server: S3Server) -> AsyncIterator[S3SnapshotStore]:
    store = S3SnapshotStore(s3_server.config("asp-" + secrets.token_hex(4), prefix="snapshots"))
    await store.ensure_bucket()
    yield store
    await store.aclose()


class TestAgentSandboxContract(ProviderContractSuite):
    oversized_workspace = "truncate -s 2G holes"  # busybox's tar writes the holes out: past the 16 MiB limit

    @pytest.fixture
    async def provider(self, node_cluster: NodeCluster, pool_namespace: str,
                       store: S3SnapshotStore) -> AsyncIterator[SandboxProvider]:
        self.cp, self.clock = node_cluster, FakeClock()
        provider = AgentSandboxProvider(kubeconfig=str(node_cluster.kubeconfig), namespace=pool_namespace,
                                        environ={"DSB_AGENT_SANDBOX_SNAPSHOT_LIMIT": "16Mi"}, store=store,
                                        settings=AgentSandboxSettings(warm_pool=POOL), clock=self.clock)
        yield provider
        await provider.aclose()

    async def lose(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        namespace, name = handle.id.split("/")
        self.cp.kubectl("delete", "sandboxclaim", "-n", namespace, name, "--wait=false")  # by hand

    async def expire_lease(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        self.clock.advance(self.lease_seconds + 1)

    async def test_spec_env_reaches_commands_but_not_the_handle(self, provider: SandboxProvider,
                                                                kit: ContractResources) -> None:
        """This provider has no sandbox env (docs/providers.md: v1.0.1 would write the values into the claim's and
        the Pod's spec): it refuses one before making anything, and says why without the value."""
        with pytest.raises(ProvisionError, match="plain text") as refused:
            await kit.provision(env={"KIT_SECRET": "s3cr3t-" + secrets.token_hex(4)})
        assert "s3cr3t" not in str(refused.value) and not refused.value.retryable


def test_a_workflow_survives_its_claim_deleted_by_hand_with_the_same_result_and_leaves_nothing(
        cluster: Cluster, agent_sandbox: AgentSandbox) -> None:
    assert isinstance(cluster.cp, NodeCluster)
    warm_pool(cluster.cp, cluster.ns, agent_sandbox, replicas=2)
    cluster.operator(DSB_AGENT_SANDBOX_ENABLED="true")
    calls = [{"type": "write_file", "path": "a.txt", "contents": "alpha\n"},
             {"type": "shell", "command": "echo beta >> a.txt; wc -l < a.txt"},
             {"type": "shell", "command": "sleep 20; cat a.txt"},
             {"type": "read_file", "path": "a.txt"}]
    sandbox = {"provider": "agent-sandbox", "template": POOL}
    for name in ("undisturbed", "disturbed"):
        cluster.cp.apply(cluster.workflow(name, sandbox=sandbox, toolCalls=calls, snapshotEveryNCalls=1),
                         "-n", cluster.ns)
    wait_in_flight(cluster.cp, cluster.ns, "disturbed", 2, timeout=180)
    claim = status(cluster.cp, cluster.ns, "disturbed")["sandbox"]["providerId"].split("/")[1]
    cluster.cp.kubectl("delete", "sandboxclaim", "-n", cluster.ns, claim, "--wait=false")
    for name in ("undisturbed", "disturbed"):
        wait_condition(cluster.cp, cluster.ns, name, "Succeeded", timeout=300)
    undisturbed, disturbed = (status(cluster.cp, cluster.ns, n) for n in ("undisturbed", "disturbed"))
    assert disturbed.get("recoveryCount") == 1 and not undisturbed.get("recoveryCount"), (disturbed, undisturbed)

    def outcomes(st: dict[str, Any]) -> list[dict[str, Any]]:  # (operation ids are each run's own)
        return [{k: v for k, v in r.items() if k != "operationId"} for r in st["result"]["toolResults"]]

    assert outcomes(disturbed) == outcomes(undisturbed) and len(outcomes(disturbed)) == len(calls)
    assert claim not in claims(cluster.cp, cluster.ns)
    for name in ("undisturbed", "disturbed"):
        cluster.cp.kubectl("delete", "workflow", name, "-n", cluster.ns, "--wait=false")
    for name in ("undisturbed", "disturbed"):
        wait_gone(cluster.cp, cluster.ns, name, timeout=120)
    wait_until(lambda: claims(cluster.cp, cluster.ns) == [] and cluster.objects() == [], 60,
               "the runs' SandboxClaims and snapshots to go")
