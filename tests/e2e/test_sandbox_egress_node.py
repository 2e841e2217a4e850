"""Egress of sandbox Pods under the chart's default NetworkPolicy, enforced on the test node (issue 32, item 7).

A sandbox Pod made by the kubernetes provider first reaches every target (so each assertion below can fail, and an
enforcer that never ran fails the test), then, once the policy the chart renders for its namespace is applied and
kube-router enforces it (netpol_support.py), cannot reach the API server, the S3 server of its snapshots or another
namespace's Pod or a link-local address, and still reaches what the values allow (a public address, and an extra
rule's address and port). The provider, on the host as the operator is, still snapshots to that S3 server.

Link-local and public addresses are probed at tests/controlplane/node.go's two addresses for this test, which the
node routes from Pods and the test serves on a link of the host: 169.254.77.77 stands for cloud metadata's
169.254.169.254 (this machine's own route to that leads off it, so the test never takes it), 198.51.100.77 for the
internet. The node has no cluster DNS, so the DNS rule is checked as rendered (tests/e2e/test_chart.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import secrets
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_sandbox.providers.contract import SandboxHandle, SandboxSpec, ToolCall
from durable_sandbox.providers.kubernetes import KubernetesProvider
from durable_sandbox.providers.kubernetes_template import PodTemplate
from durable_sandbox.providers.s3_snapshots import S3SnapshotStore
from tests.e2e.sandbox_support import IMAGE, control_plane_on_the_node, node
from tests.objectstore import S3Server, install_versitygw

from .controlplane import HELM_PATH, PROJECT_ROOT, ControlPlane, kubernetes_version
from .netpol_support import Enforcer, run_enforcer
from .node_support import NodeCluster

__all__ = ["control_plane_on_the_node", "node"]  # fixtures

NODE_IP = "10.88.0.1"  # tests/controlplane/node.go: the Pod bridge's gateway, a host address
API_SERVER = "10.0.0.1:443"  # the `kubernetes` Service: socat on the host, forwarding to the API server
# tests/controlplane/node.go's egressProbeLinkLocal and egressProbePublic: routed from Pods to the node.
LINK_LOCAL_IP = "169.254.77.77"
PUBLIC_IP = "198.51.100.77"
PROBE_LINK = "dsb-egress0"  # holds both while the module runs (a bridge: dummy links are unavailable here)


@pytest.fixture(scope="module")
def network_policy_enforcer(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Enforcer]:
    with run_enforcer(node_cluster, tmp_path_factory.mktemp("kube-router")) as enforcer:
        yield enforcer


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"reached\n")

    def log_message(self, *_: Any) -> None:
        pass


@contextlib.contextmanager
def http_listener(host: str) -> Iterator[int]:
    """An HTTP server on ``host`` (a port of its own) answering every GET; yields the port."""
    server = http.server.ThreadingHTTPServer((host, 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, text=True, check=True)


@pytest.fixture(scope="module")
def probe_addresses(node_cluster: NodeCluster) -> Iterator[None]:
    """LINK_LOCAL_IP and PUBLIC_IP as local addresses of the host while the module runs (the kernel's local table
    wins over the node's routes that otherwise drop them), so that a Pod's packets to them reach listeners here."""
    _ip("link", "add", PROBE_LINK, "type", "bridge")
    try:
        for address in (LINK_LOCAL_IP, PUBLIC_IP):
            _ip("addr", "add", f"{address}/32", "dev", PROBE_LINK)
        _ip("link", "set", PROBE_LINK, "up")
        yield
    finally:
        _ip("link", "del", PROBE_LINK)


@pytest.fixture(scope="module")
def node_s3(tmp_path_factory: pytest.TempPathFactory, node_cluster: NodeCluster) -> Iterator[S3Server]:
    """An S3 server on the node's address, where a Pod could reach it (the session's listens on loopback)."""
    root = tmp_path_factory.mktemp("s3-node")
    server = S3Server(binary=install_versitygw(), data=root / "data", log=root / "versitygw.log", host=NODE_IP)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespaces(control_plane: ControlPlane, node: str) -> Iterator[tuple[str, str]]:
    """The sandbox's namespace and another one."""
    names = ("egr-" + secrets.token_hex(4), "egr-other-" + secrets.token_hex(4))
    for name in names:
        control_plane.kubectl("create", "namespace", name)
    yield names
    for name in names:
        control_plane.kubectl("delete", "namespace", name, "--wait=false")


def chart_policy(namespace: str, extra_rules: list[dict[str, Any]], home: Path) -> dict[str, Any]:
    """The NetworkPolicy the chart renders for ``namespace`` with its default values plus ``extra_rules``."""
    values = home / "values.yaml"
    values.write_text(yaml.safe_dump({"watchNamespaces": [namespace],
                                      "providers": {"kubernetes": {"networkPolicy": {"egress": extra_rules}}}}))
    env = {**os.environ, **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}
    out = subprocess.run([str(HELM_PATH), "template", "dsb", str(PROJECT_ROOT / "charts" / "durable-sandbox"),
                          "-n", "durable-sandbox-system", "--kube-version", kubernetes_version(), "-f", str(values),
                          "--show-only",
                          "templates/networkpolicy.yaml"], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    [policy] = [d for d in yaml.safe_load_all(out) if d]
    assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["namespace"] == namespace
    return dict(policy)


def other_pod(cp: ControlPlane, namespace: str) -> str:
    """A Pod in ``namespace`` serving HTTP on 8080 (busybox httpd); its address."""
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": namespace},
                "spec": {"containers": [{"name": "web", "image": IMAGE, "imagePullPolicy": "Never",
                                         "command": ["sh", "-c", "echo hi > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"]}],
                         "automountServiceAccountToken": False}}
    cp.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    cp.kubectl("wait", "--for=condition=Ready", "pod/web", "-n", namespace, "--timeout=120s", timeout=150)
    return str(cp.kubectl_json("get", "pod", "web", "-n", namespace)["status"]["podIP"])


async def reached(provider: KubernetesProvider, handle: SandboxHandle, targets: dict[str, str]) -> dict[str, bool]:
    """Which ``targets`` (name -> host:port) answer an HTTP request from inside the sandbox: any HTTP answer counts
    (the API server's 400 to plain HTTP on its TLS port too); connection refused or timed out does not. (busybox
    nc: the host's static busybox wget crashes here.)"""
    script = "".join(
        f"out=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {address.replace(':', ' ')} 2>&1 | head -n 1); "
        f'case "$out" in HTTP/*) echo "{name} yes";; *) echo "{name} no: $out";; esac; '
        for name, address in targets.items())
    result = await provider.execute(handle, ToolCall(operation_id="probe-" + secrets.token_hex(4), type="shell",
                                                     args={"command": script, "timeout": 60}))
    print(result.stdout, result.stderr)  # shown when the test fails: what each probe got
    answers = [line for line in result.stdout.splitlines() if line.endswith(" yes")]
    return {name: f"{name} yes" in answers for name in targets}


@pytest.fixture
async def provider(control_plane: ControlPlane, namespaces: tuple[str, str],
                   node_s3: S3Server) -> AsyncIterator[tuple[KubernetesProvider, S3SnapshotStore]]:
    store = S3SnapshotStore(node_s3.config("egress-" + secrets.token_hex(4), prefix="snapshots"))
    await store.ensure_bucket()
    provider = KubernetesProvider(kubeconfig=str(control_plane.kubeconfig), namespace=namespaces[0], environ={},
                                  template=PodTemplate(image=IMAGE, imagePullPolicy="Never"), store=store)
    yield provider, store
    await provider.aclose()
    await store.aclose()


async def test_the_default_policy_keeps_sandbox_code_from_the_cluster_and_link_local(
        control_plane: ControlPlane, namespaces: tuple[str, str], network_policy_enforcer: Enforcer,
        probe_addresses: None, node_s3: S3Server, provider: tuple[KubernetesProvider, S3SnapshotStore],
        tmp_path: Path) -> None:
    kubernetes, store = provider
    sandbox_ns, other_ns = namespaces
    web = other_pod(control_plane, other_ns)
    with http_listener(NODE_IP) as allowed_port, http_listener(LINK_LOCAL_IP) as link_local_port, \
            http_listener(PUBLIC_IP) as public_port:
        denied = {"api server": API_SERVER, "s3": f"{NODE_IP}:{node_s3.port}", "other namespace": f"{web}:8080",
                  "link-local": f"{LINK_LOCAL_IP}:{link_local_port}"}
        allowed = {"extra rule": f"{NODE_IP}:{allowed_port}", "public": f"{PUBLIC_IP}:{public_port}"}
        handle = await kubernetes.provision(SandboxSpec(owner=f"{sandbox_ns}/owner", operation_id="op-egress"),
                                            lease_seconds=600)
        try:
            # Without a policy every target answers: each "blocked" below is the policy's doing.
            assert await reached(kubernetes, handle, denied | allowed) == dict.fromkeys(denied | allowed, True)

            policy = chart_policy(sandbox_ns, [{"to": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}],
                                                "ports": [{"port": allowed_port, "protocol": "TCP"}]}], tmp_path)
            control_plane.kubectl("apply", "-f", "-", input=json.dumps(policy))
            await wait_for_block(kubernetes, handle, {"api server": API_SERVER}, network_policy_enforcer)

            assert await reached(kubernetes, handle, denied | allowed) == (
                dict.fromkeys(denied, False) | dict.fromkeys(allowed, True))
            # The object the API server holds excepts all of link-local, 169.254.169.254 with the address probed.
            stored = control_plane.kubectl_json("get", "networkpolicy", policy["metadata"]["name"], "-n", sandbox_ns)
            [v4] = [peer["ipBlock"] for rule in stored["spec"]["egress"] for peer in rule.get("to", [])
                    if peer.get("ipBlock", {}).get("cidr") == "0.0.0.0/0"]
            assert {"10.0.0.0/8", "169.254.0.0/16"} <= set(v4["except"])
            # The operator (here: the provider, on the host as the operator is) still reaches S3.
            await kubernetes.execute(handle, ToolCall(operation_id="w", type="write_file",
                                                      args={"path": "kept.txt", "contents": "kept"}))
            snapshot = await kubernetes.snapshot(handle, operation_id="snap-egress")
            assert snapshot and node_s3.objects(store.config.bucket)
            await kubernetes.delete_snapshot(snapshot)
        finally:
            await kubernetes.destroy(handle)


async def wait_for_block(provider: KubernetesProvider, handle: SandboxHandle, target: dict[str, str],
                         enforcer: Enforcer) -> None:
    """Until the enforcer has programmed the new policy (it reacts to the watch event within seconds)."""
    deadline = time.monotonic() + 60
    while (await reached(provider, handle, target)) != dict.fromkeys(target, False):
        if time.monotonic() > deadline or not enforcer.alive():
            raise AssertionError(f"the policy never took effect on {target}; kube-router:\n{enforcer.tail()}")
        await asyncio.sleep(1)
