"""`dsb operator` with the kubernetes provider (issue 23, acceptance 2): sandboxes are Pods on the test node,
snapshots go to a real S3 server (versitygw on loopback).

The example Workflow reaches Succeeded; loss injection and a Pod deleted by hand both recover by restore and
replay; a Sandbox suspends to zero Pods and resumes with its files; deleting a Workflow mid-run leaves no Pod and
no snapshot object; with the store down, deleting it is CleanupBlocked, then cleanup finishes once it is back.

Runs on the test node (issue 22's ``node_cluster``, whose control plane the operator serves); the sandbox image
is built and imported there. A node that cannot be prepared fails these tests; they are never skipped.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from durable_sandbox.providers.contract import SandboxHandle, ToolCall, tag_key
from durable_sandbox.providers.kubernetes import KubernetesProvider
from tests.e2e.controlplane import wait_until
from tests.e2e.kubernetes_operator_support import ROOT, Cluster, cluster
from tests.e2e.node_support import NodeCluster, busybox_context, require_gvisor
from tests.e2e.operator_support import (
    events,
    namespace,
    operators,
    status,
    wait_condition,
    wait_gone,
    wait_in_flight,
)
from tests.e2e.sandbox_support import IMAGE, control_plane_on_the_node, node, set_suspend, wait_for

__all__ = ["cluster", "control_plane_on_the_node", "namespace", "node", "operators"]  # fixtures


def test_the_example_succeeds_on_a_pod_and_leaves_nothing(cluster: Cluster) -> None:
    cluster.operator()
    cluster.cp.apply(cluster.workflow("hello-pod"), "-n", cluster.ns)
    wait_condition(cluster.cp, cluster.ns, "hello-pod", "Succeeded", timeout=180)
    results = status(cluster.cp, cluster.ns, "hello-pod")
    assert results.get("phase") == "Succeeded", results
    wait_until(lambda: cluster.pods() == [] and cluster.objects() == [], 60, "the run's Pod and snapshots to go")


def test_a_workflow_naming_no_provider_runs_on_a_pod_when_kubernetes_is_the_default(cluster: Cluster) -> None:
    """examples/default-provider-workflow.yaml, unchanged, with the operator's default as the chart sets it where
    the kubernetes provider is on (issue 23: no cloud account, no local provider needed)."""
    cluster.operator(DSB_DEFAULT_PROVIDER="kubernetes")
    cluster.cp.kubectl("apply", "-n", cluster.ns, "-f", str(ROOT / "examples" / "default-provider-workflow.yaml"))
    wait_condition(cluster.cp, cluster.ns, "hello-default", "Succeeded", timeout=180)
    st = status(cluster.cp, cluster.ns, "hello-default")
    assert [r["stdout"] for r in st["result"]["toolResults"]][1:] == ["hello, 1 line(s)\n",
                                                                     "hello from the default provider\n"], st
    provisioned = [e["message"] for e in events(cluster.cp, cluster.ns, "hello-default") if e["reason"] == "Provisioned"]
    assert provisioned and all(m.endswith("(kubernetes)") and f"{cluster.ns}/" in m for m in provisioned), provisioned
    wait_until(lambda: cluster.pods() == [], 60, "the run's Pod to go")


def test_loss_injection_and_a_pod_deleted_by_hand_recover_by_restore_and_replay(cluster: Cluster) -> None:
    cluster.operator()
    cluster.cp.apply(cluster.workflow("injected", injectLossAfterNCalls=3), "-n", cluster.ns)
    wait_condition(cluster.cp, cluster.ns, "injected", "Succeeded", timeout=240)
    assert status(cluster.cp, cluster.ns, "injected").get("recoveryCount") == 1

    calls = [{"type": "write_file", "path": "a.txt", "contents": "a"}, {"type": "shell", "command": "cat a.txt"},
             {"type": "shell", "command": "sleep 30; cat a.txt"}, {"type": "read_file", "path": "a.txt"}]
    cluster.cp.apply(cluster.workflow("by-hand", toolCalls=calls, snapshotEveryNCalls=1), "-n", cluster.ns)
    wait_in_flight(cluster.cp, cluster.ns, "by-hand", 2, timeout=180)
    [pod] = cluster.pods()
    cluster.cp.kubectl("delete", "pod", "-n", cluster.ns, pod, "--grace-period=0", "--force")
    wait_condition(cluster.cp, cluster.ns, "by-hand", "Succeeded", timeout=240)
    assert status(cluster.cp, cluster.ns, "by-hand").get("recoveryCount") == 1
    wait_until(lambda: cluster.pods() == [] and cluster.objects() == [], 60, "the runs' Pods and snapshots to go")


def test_a_sandbox_suspends_to_zero_pods_and_resumes_with_its_files(cluster: Cluster) -> None:
    cluster.operator()
    cluster.cp.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "box"},
                      "spec": {"provider": "kubernetes"}}, "-n", cluster.ns)
    first = wait_for(cluster.cp, cluster.ns, "box", "Ready", timeout=180)["providerId"]
    assert _call(cluster, first, "write_file", path="notes.txt", contents="kept\n") == (0, "wrote notes.txt 5 bytes")
    set_suspend(cluster.cp, cluster.ns, "box", True)
    wait_for(cluster.cp, cluster.ns, "box", "Suspended", timeout=180)
    wait_until(lambda: cluster.pods() == [], 60, "the suspended Sandbox's Pod to go")
    assert len(cluster.objects()) == 1, "suspend is a snapshot in the store"
    set_suspend(cluster.cp, cluster.ns, "box", False)
    second = wait_for(cluster.cp, cluster.ns, "box", "Ready", timeout=180)["providerId"]
    assert second != first and _call(cluster, second, "read_file", path="notes.txt") == (0, "kept\n")
    cluster.cp.kubectl("delete", "dsbx", "box", "-n", cluster.ns)
    wait_until(lambda: cluster.pods() == [] and cluster.objects() == [], 90, "the Sandbox's Pod and snapshots to go")


def test_deleting_mid_run_leaves_nothing_and_a_store_that_is_down_blocks_cleanup_until_it_is_back(
        cluster: Cluster) -> None:
    # With the store down, cleanup gives up after 2 tries of each deletion (--cleanup-attempts; by default 8, some
    # 30 s of backoff in the run's cancel and again in the finalizer): the finalizer's CleanupBlocked is what counts.
    cluster.operator("--cleanup-attempts", "2")
    calls = [{"type": "write_file", "path": "a.txt", "contents": "a"}, {"type": "shell", "command": "cat a.txt"},
             {"type": "shell", "command": "sleep 600"}]
    cluster.cp.apply(cluster.workflow("mid-run", toolCalls=calls, snapshotEveryNCalls=1), "-n", cluster.ns)
    wait_in_flight(cluster.cp, cluster.ns, "mid-run", 2, timeout=180)
    assert cluster.objects(), "a snapshot was taken before the call in flight"
    cluster.cp.kubectl("delete", "workflow", "mid-run", "-n", cluster.ns, "--wait=false")
    wait_gone(cluster.cp, cluster.ns, "mid-run", timeout=180)
    assert cluster.pods() == [] and cluster.objects() == []

    cluster.cp.apply(cluster.workflow("blocked", toolCalls=calls, snapshotEveryNCalls=1), "-n", cluster.ns)
    wait_in_flight(cluster.cp, cluster.ns, "blocked", 2, timeout=180)
    cluster.s3.stop()
    try:
        cluster.cp.kubectl("delete", "workflow", "blocked", "-n", cluster.ns, "--wait=false")
        wait_condition(cluster.cp, cluster.ns, "blocked", "CleanupBlocked", timeout=180)
    finally:
        cluster.s3.start()
    wait_gone(cluster.cp, cluster.ns, "blocked", timeout=300)
    assert cluster.pods() == [] and cluster.objects() == []


def test_a_gvisor_template_runs_the_sandbox_under_gvisor_and_status_says_so(cluster: Cluster) -> None:
    """examples/gvisor-sandbox.yaml, unchanged: a PodTemplate naming RuntimeClass gvisor, a Sandbox made from it
    and a Workflow in it. The sandbox's kernel is gVisor's (its dmesg), and both statuses and `kubectl get -o
    wide` name the RuntimeClass."""
    assert isinstance(cluster.cp, NodeCluster)
    runtime_class = require_gvisor(cluster.cp)
    # The example's image, which nothing here can pull: the busybox test image under its name.
    cluster.cp.build_image(busybox_context(), "docker.io/library/busybox:1.36")
    cluster.operator()
    cluster.cp.kubectl("apply", "-n", cluster.ns, "-f", str(ROOT / "examples" / "gvisor-sandbox.yaml"))
    box = wait_for(cluster.cp, cluster.ns, "isolated", "Ready", timeout=180)
    assert box["handle"]["runtimeClassName"] == runtime_class, box
    wait_condition(cluster.cp, cluster.ns, "under-gvisor", "Succeeded", timeout=180)
    st = status(cluster.cp, cluster.ns, "under-gvisor")
    assert [r["stdout"] for r in st["result"]["toolResults"]] == [
        "Starting gVisor\n", "wrote notes/isolated.txt 21 bytes", "written under gVisor\n"], st
    assert st["sandbox"]["runtimeClassName"] == runtime_class, st["sandbox"]
    [pod] = cluster.pods()
    assert cluster.cp.kubectl_json("get", "pod", "-n", cluster.ns, pod)["spec"]["runtimeClassName"] == runtime_class
    wide = cluster.cp.kubectl("get", "dsbx", "isolated", "-n", cluster.ns, "-o", "wide").stdout.splitlines()
    assert "RUNTIME" in wide[0].split() and runtime_class in wide[1].split(), wide
    assert "RUNTIME" not in cluster.cp.kubectl("get", "dsbx", "-n", cluster.ns).stdout, "-o wide only"
    cluster.cp.kubectl("delete", "-n", cluster.ns, "-f", str(ROOT / "examples" / "gvisor-sandbox.yaml"))
    wait_until(lambda: cluster.pods() == [], 90, "the Sandbox's Pod to go")



def test_a_shared_sandbox_changing_hands_ends_what_the_last_holder_left_running(cluster: Cluster) -> None:
    """Issue 32 item 6: Workflow A's call leaves processes in the Sandbox's Pod that its call's end does not find
    (``env -i`` drops the call's tag; one of them double-forked too). They are alive while A holds the Sandbox (its
    next call counts them); before B's first call every process but the Pod's keep-alive is ended, so nothing A
    left can read B's per-call env or its files. The Pod is the same one, its files kept."""
    cluster.operator()
    cluster.cp.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "shared"},
                      "spec": {"provider": "kubernetes"}}, "-n", cluster.ns)
    pod = wait_for(cluster.cp, cluster.ns, "shared", "Ready", timeout=180)["providerId"]
    marker = "left-by-a-" + secrets.token_hex(4)
    loop, quiet = "while :; do sleep 1; done", "</dev/null >/dev/null 2>&1"
    # The pattern's brackets keep the counting shell's own command line from matching it.
    count = ("n=0; for d in /proc/[0-9]*; do case \"$(tr '\\000' ' ' 2>/dev/null < $d/cmdline)\" in "
             f"*{marker.replace('left-', 'lef[t]-')}*) n=$((n+1)) ;; esac; done; echo $n")
    leave = (f"env -i /bin/sh -c '{loop}' {marker} {quiet} & "
             f"( env -i /bin/sh -c '{loop}' {marker}-forked {quiet} & ) ; echo left")

    def shared(name: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        return cluster.workflow(name, sandbox=None, sandboxRef={"name": "shared"}, toolCalls=calls,
                                snapshotEveryNCalls=None)

    cluster.cp.apply(shared("holder-a", [{"type": "write_file", "path": "a.txt", "contents": "from a"},
                                         {"type": "shell", "command": leave}, {"type": "shell", "command": count}]),
                     "-n", cluster.ns)
    wait_condition(cluster.cp, cluster.ns, "holder-a", "Succeeded", timeout=180)
    ran_a = [r["stdout"] for r in status(cluster.cp, cluster.ns, "holder-a")["result"]["toolResults"]]
    assert ran_a[1:] == ["left\n", "2\n"], f"A's leftovers outlived its call: {ran_a}"
    cluster.cp.apply(shared("holder-b", [{"type": "shell", "command": count, "env": {"B_TOKEN": "b-only"}},
                                         {"type": "shell", "command": "cat a.txt"}]), "-n", cluster.ns)
    wait_condition(cluster.cp, cluster.ns, "holder-b", "Succeeded", timeout=180)
    ran_b = [r["stdout"] for r in status(cluster.cp, cluster.ns, "holder-b")["result"]["toolResults"]]
    assert ran_b == ["0\n", "from a"], f"nothing A left runs beside B's calls; the files are kept: {ran_b}"
    assert wait_for(cluster.cp, cluster.ns, "shared", "Ready")["providerId"] == pod, "the same Pod throughout"
    cluster.cp.kubectl("delete", "dsbx", "shared", "-n", cluster.ns)
    wait_until(lambda: cluster.pods() == [], 90, "the Sandbox's Pod to go")

def _call(cluster: Cluster, provider_id: str, call_type: str, **args: Any) -> tuple[int, str]:
    """One call straight into the Sandbox's Pod, as the operator makes it: the handle carries the Pod's uid (read
    here as the operator records it), since a call reaches only the Pod the handle names by uid (or the
    operator's seal, whose key this test's provider does not hold)."""
    pod_ns, _, pod_name = provider_id.partition("/")
    uid = cluster.cp.kubectl_json("get", "pod", pod_name, "-n", pod_ns)["metadata"]["uid"]

    async def go() -> tuple[int, str]:
        provider = KubernetesProvider(kubeconfig=str(cluster.cp.kubeconfig), environ={})
        try:
            result = await provider.execute(SandboxHandle(id=provider_id, provider="kubernetes", metadata={"uid": uid}),
                                            ToolCall(operation_id=f"test-{call_type}", type=call_type, args=args))
        finally:
            await provider.aclose()
        return result.exit_code, result.stdout

    return asyncio.run(go())


def test_a_resumed_sandbox_never_adopts_a_pod_planted_with_its_labels(cluster: Cluster) -> None:
    """Issue 32 item 1, as it was found: a namespace user who may only create Pods plants one carrying the labels
    and annotations of the Sandbox's next provision (all printed on its Pod, the operation id predictable), with
    her image and the host's network. The resume restores into a Pod of the operator's own; the planted one is
    refused (a Warning Event on it), not used, not deleted, and the workspace is the snapshot's."""
    cluster.operator()
    cluster.cp.apply({"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "box"},
                      "spec": {"provider": "kubernetes"}}, "-n", cluster.ns)
    first = wait_for(cluster.cp, cluster.ns, "box", "Ready", timeout=180)["providerId"]
    assert _call(cluster, first, "write_file", path="notes.txt", contents="kept\n") == (0, "wrote notes.txt 5 bytes")
    live = cluster.cp.kubectl_json("get", "pod", "-n", cluster.ns, first.split("/")[1])
    set_suspend(cluster.cp, cluster.ns, "box", True)
    suspended = wait_for(cluster.cp, cluster.ns, "box", "Suspended", timeout=180)
    wait_until(lambda: cluster.pods() == [], 60, "the suspended Sandbox's Pod to go")

    uid = cluster.cp.kubectl_json("get", "dsbx", "box", "-n", cluster.ns)["metadata"]["uid"]
    next_operation = f"dsbx-{uid[:8]}-{int(suspended['operationCount']) + 1}-restore"
    labels = {**live["metadata"]["labels"], "durable-sandbox.dev/operation-key": tag_key(next_operation)}
    described = json.loads(live["metadata"]["annotations"]["durable-sandbox.dev/sandbox"])
    described["labels"]["durable-sandbox.dev/operation"] = next_operation
    annotations = {**live["metadata"]["annotations"], "durable-sandbox.dev/sandbox": json.dumps(described)}
    cluster.cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "planted", "labels": labels,
                                                                      "annotations": annotations},
                      "spec": {"hostNetwork": True, "automountServiceAccountToken": False, "containers": [
                          {"name": "sandbox", "image": IMAGE, "imagePullPolicy": "Never",
                           "command": ["sh", "-c", "echo planted > /tmp/planted; sleep 3600"]}]}}, "-n", cluster.ns)
    planted_uid = cluster.cp.kubectl_json("get", "pod", "planted", "-n", cluster.ns)["metadata"]["uid"]

    set_suspend(cluster.cp, cluster.ns, "box", False)
    resumed = wait_for(cluster.cp, cluster.ns, "box", "Ready", timeout=180)
    assert resumed["providerId"] != f"{cluster.ns}/planted", "the planted Pod was adopted"
    assert _call(cluster, resumed["providerId"], "read_file", path="notes.txt") == (0, "kept\n"), "restored"
    assert cluster.cp.kubectl_json("get", "pod", "planted", "-n", cluster.ns)["metadata"]["uid"] == planted_uid
    wait_until(lambda: [e for e in events(cluster.cp, cluster.ns, "planted")
                        if e["type"] == "Warning" and e["reason"] == "SandboxPodRefused"], 60,
               "a Warning Event on the planted Pod")
    cluster.cp.kubectl("delete", "dsbx", "box", "-n", cluster.ns)
    wait_until(lambda: cluster.pods() == ["planted"], 90, "the Sandbox's own Pod to go (and only it)")
    cluster.cp.kubectl("delete", "pod", "planted", "-n", cluster.ns, "--grace-period=0", "--force")
