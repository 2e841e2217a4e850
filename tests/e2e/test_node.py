"""The test node itself (tests/controlplane node.go through the ``node_cluster`` fixture): a Node that is Ready
with credentials done properly, Pods from a locally built image that run, and what kubectl does with them
(logs, exec, exec -i, cp both ways), Deployments scheduled with readiness probes, the `kubernetes` Service
reachable from a Pod, and a kubelet API that answers nobody anonymous."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.controlplane import fresh_namespace

from .controlplane import kubernetes_version
from .node_support import NodeCluster, busybox_image, require_gvisor

NODE_IP = "10.88.0.1"


@pytest.fixture(scope="module")
def busybox(node_cluster: NodeCluster) -> str:
    return busybox_image(node_cluster)


@pytest.fixture
def namespace(node_cluster: NodeCluster) -> Iterator[str]:
    with fresh_namespace(node_cluster, "node") as ns:
        yield ns


def pod(name: str, image: str, command: str) -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": image, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", command]}]},
    }


def test_node_is_ready_and_registered_with_its_own_identity(node_cluster: NodeCluster) -> None:
    node = node_cluster.kubectl_json("get", "node", node_cluster.node)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True", node["status"]["conditions"]
    assert not node["spec"].get("taints"), "the node-lifecycle controller lifts the not-ready taint"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == kubernetes_version()
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": NODE_IP} in node["status"]["addresses"]
    # The kubelet is system:node:<name> in group system:nodes, held to its own Node by the Node authorizer.
    as_node = ["--as", f"system:node:{node_cluster.node}", "--as-group", "system:nodes"]
    can = lambda *args: node_cluster.kubectl("auth", "can-i", *args, *as_node, check=False).stdout.strip()  # noqa: E731
    assert can("patch", f"nodes/{node_cluster.node}", "--subresource=status") == "yes"
    assert can("list", "secrets", "--all-namespaces").startswith("no")
    assert can("create", "clusterrolebindings").startswith("no")


def test_pod_from_a_locally_built_image_runs_and_kubectl_reaches_it(
    node_cluster: NodeCluster, busybox: str, namespace: str, tmp_path: Path
) -> None:
    k = node_cluster
    k.apply(pod("bb", busybox, "echo started in the pod; exec sleep 3600"), "-n", namespace)
    k.kubectl("wait", "--for=condition=Ready", "pod/bb", "-n", namespace, "--timeout=120s")
    k.wait_until(lambda: "started in the pod" in k.kubectl("logs", "bb", "-n", namespace).stdout, 30, "the Pod's log")
    assert k.kubectl("exec", "bb", "-n", namespace, "--", "id", "-u").stdout.strip() == "0"
    # exec -i: stdin reaches the process, its stdout comes back.
    out = k.kubectl("exec", "-i", "bb", "-n", namespace, "--", "sh", "-c", "tr a-z A-Z", input="through stdin\n")
    assert out.stdout == "THROUGH STDIN\n"
    # exit codes come back through exec
    assert k.kubectl("exec", "bb", "-n", namespace, "--", "sh", "-c", "exit 7", check=False).returncode == 7
    # cp both ways (tar in the image)
    src = tmp_path / "in.txt"
    src.write_text("copied into the pod\n")
    k.kubectl("cp", str(src), f"{namespace}/bb:/tmp/in.txt")
    assert k.kubectl("exec", "bb", "-n", namespace, "--", "cat", "/tmp/in.txt").stdout == "copied into the pod\n"
    k.kubectl("exec", "bb", "-n", namespace, "--", "sh", "-c", "echo made in the pod > /tmp/out.txt")
    k.kubectl("cp", f"{namespace}/bb:/tmp/out.txt", str(tmp_path / "out.txt"))
    assert (tmp_path / "out.txt").read_text() == "made in the pod\n"


def test_kubernetes_service_is_reachable_from_a_pod(node_cluster: NodeCluster, busybox: str, namespace: str) -> None:
    k = node_cluster
    # busybox's TLS client cannot talk to the API server's ciphers; a plain HTTP request to its TLS port gets
    # the API server's own answer, which proves the path Pod -> 10.0.0.1:443 -> API server.
    probe = "printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' | nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT"
    k.apply(pod("svc", busybox, f"{probe}; exec sleep 3600"), "-n", namespace)
    k.kubectl("wait", "--for=condition=Ready", "pod/svc", "-n", namespace, "--timeout=120s")
    out = k.kubectl("exec", "svc", "-n", namespace, "--", "sh", "-c", f"env | grep ^KUBERNETES_SERVICE_HOST; {probe}")
    assert "KUBERNETES_SERVICE_HOST=10.0.0.1" in out.stdout
    assert "Client sent an HTTP request to an HTTPS server" in out.stdout, out.stdout
    # Pods have no default route: nothing leaves the machine.
    routes = k.kubectl("exec", "svc", "-n", namespace, "--", "ip", "route").stdout
    assert "default" not in routes and "10.0.0.0/24" in routes, routes


def test_deployment_is_scheduled_and_its_readiness_probe_answered(
    node_cluster: NodeCluster, busybox: str, namespace: str
) -> None:
    k = node_cluster
    container = {
        "name": "web", "image": busybox, "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"],
        "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1},
    }
    k.apply({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]}}},
    }, "-n", namespace)
    k.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=120s")
    pods = k.kubectl_json("get", "pods", "-n", namespace, "-l", "app=web")["items"]
    assert len(pods) == 2 and all(p["spec"]["nodeName"] == k.node for p in pods)
    assert all(c["ready"] for p in pods for c in p["status"]["containerStatuses"])


def test_kubelet_api_answers_nobody_anonymous(node_cluster: NodeCluster) -> None:
    ca = ssl.create_default_context(cafile=str(node_cluster.dir / "pki" / "ca.crt"))
    # Its serving certificate is the cluster CA's, for the node's address (the API server verifies it).
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"https://{NODE_IP}:10250/pods", context=ca, timeout=10)
    assert anonymous.value.code == 401
    # A valid identity without kubelet-API rights is authenticated (webhook) and then refused (webhook authz).
    token = node_cluster.kubectl("create", "token", "default", "-n", "default").stdout.strip()
    request = urllib.request.Request(f"https://{NODE_IP}:10250/pods", headers={"Authorization": f"Bearer {token}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=ca, timeout=10)
    assert refused.value.code == 403
    # The read-only port is off.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{NODE_IP}:10255/pods", timeout=5)


def test_a_gvisor_pod_runs_under_gvisors_kernel_and_a_plain_one_does_not(
    node_cluster: NodeCluster, busybox: str, namespace: str
) -> None:
    """RuntimeClass gvisor (``up --node-gvisor``, scripts/gvisor-build): the Pod's kernel is gVisor's Sentry, whose
    own boot log dmesg reads; under runc the same command reaches the host's kernel log and is refused."""
    k = node_cluster
    runtime_class = require_gvisor(k)
    assert k.kubectl_json("get", "runtimeclass", runtime_class)["handler"] == "runsc"
    under_gvisor = pod("sandboxed", busybox, "exec sleep 3600")
    under_gvisor["spec"]["runtimeClassName"] = runtime_class  # type: ignore[index]
    k.apply(under_gvisor, "-n", namespace)
    k.apply(pod("plain", busybox, "exec sleep 3600"), "-n", namespace)
    k.kubectl("wait", "--for=condition=Ready", "pod/sandboxed", "pod/plain", "-n", namespace, "--timeout=120s")
    sandboxed = k.kubectl("exec", "sandboxed", "-n", namespace, "--", "dmesg", check=False)
    assert sandboxed.returncode == 0 and "Starting gVisor" in sandboxed.stdout, sandboxed.stdout + sandboxed.stderr
    plain = k.kubectl("exec", "plain", "-n", namespace, "--", "dmesg", check=False)
    assert "Starting gVisor" not in plain.stdout
    assert plain.returncode != 0 and "not permitted" in plain.stderr, plain.stdout + plain.stderr
    # What a sandbox relies on works the same under gVisor: exit codes, stdin, the filesystem.
    assert k.kubectl("exec", "sandboxed", "-n", namespace, "--", "sh", "-c", "exit 7", check=False).returncode == 7
    out = k.kubectl("exec", "-i", "sandboxed", "-n", namespace, "--", "sh", "-c", "tr a-z A-Z > /tmp/x; cat /tmp/x",
                    input="under gvisor\n")
    assert out.stdout == "UNDER GVISOR\n"
    assert k.kubectl_json("get", "pod", "sandboxed", "-n", namespace)["spec"]["runtimeClassName"] == runtime_class
