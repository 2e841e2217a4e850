"""Warm Pods (issue 27, item 1) on the test node: ``dsb operator`` keeps a SandboxPool full, provisions claim its
Pods with one conditional write, and nothing forged is ever claimed.

- 50 concurrent provisions from two provider instances (two API clients, as two operator replicas) against a pool of
  10 that two operator replicas filled: exactly 10 warm claims, no Pod claimed twice, 40 cold Pods, all 50 sandboxes
  run a call, two forged "warm" Pods (a made-up seal, and a real Pod's seal copied) are never claimed nor counted,
  and after cleanup nothing is left; an operator started again refills the pool.
- The example (examples/warm-pool.yaml: PodTemplate, SandboxPool, Workflow) applied as written (the image swapped
  for the node's): ``kubectl get dsbpool`` shows ready/claimed/total, the Workflow succeeds on a warm Pod (the claim
  metric counts it), an edit of the PodTemplate rolls the pool, deleting the pool deletes its Pods.

A node that cannot be prepared fails these tests; they are never skipped.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_sandbox.providers.contract import SandboxHandle, SandboxSpec, ToolCall
from durable_sandbox.providers.kubernetes import SANDBOX_LABEL, KubernetesProvider
from durable_sandbox.providers.kubernetes_pool import (
    POOL_LABEL,
    POOL_STATE_LABEL,
    SEAL_ANNOTATION,
    TEMPLATE_HASH_LABEL,
    derive_pool_key,
)
from durable_sandbox.providers.kubernetes_template import PodTemplate
from tests.e2e.controlplane import ControlPlane, wait_until
from tests.e2e.operator_support import (
    OperatorProcess,
    namespace,
    operators,
    scrape,
    wait_condition,
)
from tests.e2e.sandbox_support import IMAGE, control_plane_on_the_node, node
from tests.ports import free_port

__all__ = ["control_plane_on_the_node", "namespace", "node", "operators"]  # fixtures

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "warm-pool.yaml"
SMALL = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "64Mi"}}  # 60 Pods on a 2-core node


class Scene:
    def __init__(self, cp: ControlPlane, ns: str, start: Any) -> None:
        self.cp, self.ns, self.start = cp, ns, start

    def operator(self, *args: str, name: str | None = None) -> OperatorProcess:
        env = {"DSB_K8S_NAMESPACES": self.ns, "KUBECONFIG": str(self.cp.kubeconfig),
               "DSB_K8S_TEMPLATE": json.dumps({"image": IMAGE, "imagePullPolicy": "Never"})}
        op: OperatorProcess = self.start(*args, env=env, name=name)
        return op

    def pool(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.cp.kubectl_json("get", "dsbpool", name, "-n", self.ns).get("status") or {}
        return status

    def wait_ready(self, name: str, size: int, timeout: float = 180) -> dict[str, Any]:
        wait_until(lambda: self.pool(name).get("ready") == size, timeout, f"pool {name} to hold {size} ready Pods")
        return self.pool(name)

    def pods(self, selector: str = f"{SANDBOX_LABEL}=true") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cp.kubectl_json("get", "pods", "-n", self.ns, "-l", selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def pool_key(self) -> bytes:
        # The operator's journal key (kube/journal/journal_key.py: made by the first replica, in `default` here).
        secret = self.cp.kubectl_json("get", "secret", "durable-sandbox-journal-key", "-n", "default")
        return derive_pool_key(base64.b64decode(secret["data"]["key"]))

    def provider(self) -> KubernetesProvider:
        return KubernetesProvider(kubeconfig=str(self.cp.kubeconfig), namespace=self.ns, environ={},
                                  template=PodTemplate(image=IMAGE, imagePullPolicy="Never"), pool_key=self.pool_key())


@pytest.fixture
def scene(control_plane: ControlPlane, node: str, namespace: str, operators: Any) -> Iterator[Scene]:
    yield Scene(control_plane, namespace, operators)


def pod_template(name: str, resources: dict[str, Any] = SMALL) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
            "template": {"spec": {"containers": [{"name": "sandbox", "image": IMAGE, "imagePullPolicy": "Never",
                                                  "resources": resources}]}}}


def sandbox_pool(name: str, template: str, size: int) -> dict[str, Any]:
    return {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": name},
            "spec": {"template": template, "size": size}}


def forged_copy(pod: dict[str, Any], name: str, seal: str | None) -> dict[str, Any]:
    """A Pod a namespace user could make: a warm Pod's labels and spec, under another name."""
    meta = pod["metadata"]
    annotations = dict(meta.get("annotations") or {})
    if seal is not None:
        annotations[SEAL_ANNOTATION] = seal
    spec = copy.deepcopy(pod["spec"])
    spec.pop("nodeName", None)
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "labels": dict(meta["labels"]), "annotations": annotations}}


async def provision_all(providers: list[KubernetesProvider], ns: str, template: str, n: int) -> list[SandboxHandle]:
    async def one(i: int) -> SandboxHandle:
        spec = SandboxSpec(template=f"podtemplate/{template}", owner=f"{ns}/owner-{i}",
                           operation_id=f"op-{i}-{secrets.token_hex(4)}")
        return await providers[i % len(providers)].provision(spec, lease_seconds=600)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def run_everywhere(provider: KubernetesProvider, handles: list[SandboxHandle]) -> list[str]:
    async def one(i: int, handle: SandboxHandle) -> str:
        result = await provider.execute(handle, ToolCall(type="shell", args={"command": f"echo sandbox-{i}"},
                                                         operation_id=f"c-{i}"))
        assert result.exit_code == 0, result
        return result.stdout.strip()

    return list(await asyncio.gather(*(one(i, h) for i, h in enumerate(handles))))


def test_fifty_concurrent_provisions_claim_each_of_ten_warm_pods_once_and_never_a_forged_one(scene: Scene) -> None:
    ns = scene.ns
    scene.cp.apply(pod_template("small"), "-n", ns)
    scene.cp.apply(sandbox_pool("ten", "small", 10), "-n", ns)
    replicas = [scene.operator(name="operator-1"), scene.operator(name="operator-2")]
    scene.wait_ready("ten", 10)
    warm = {p["metadata"]["name"]: p for p in scene.pods(f"{POOL_LABEL}=ten,{POOL_STATE_LABEL}=warm")}
    assert len(warm) == 10, sorted(warm)

    # Two forgeries with the pool's labels and a warm Pod's spec: a made-up seal, and a real Pod's seal copied.
    real = next(iter(warm.values()))
    scene.cp.apply(forged_copy(real, "forged-made-up", "w.AAAAAAAAAAAAAAAAAAAAAA"), "-n", ns)
    scene.cp.apply(forged_copy(real, "forged-copied", real["metadata"]["annotations"][SEAL_ANNOTATION]), "-n", ns)
    forged = {"forged-made-up", "forged-copied"}
    for name in forged:
        scene.cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", ns, "--timeout=120s", timeout=150)
    # The reconciler saw them (it says so) and counted neither.
    wait_until(lambda: all(f"Pod {ns}/{name} refused: pool ten: it has the pool's label but not the operator's seal" in
                           "".join(op.logs() for op in replicas) for name in forged), 60,
               "the pool's reconciler to see the forged Pods")
    assert scene.pool("ten")["total"] == 10 and scene.pool("ten")["ready"] == 10
    for op in replicas:
        op.expect_log(r"not the operator's seal")
        op.stop()  # no refill while the provisions run: the 10 warm Pods are all there is

    async def scenario() -> tuple[list[SandboxHandle], list[str]]:
        providers = [scene.provider(), scene.provider()]  # two API clients, as two replicas
        try:
            handles = await provision_all(providers, ns, "small", 50)
            outputs = await run_everywhere(providers[0], handles)
            return handles, outputs
        finally:
            for p in providers:
                await p.aclose()

    handles, outputs = asyncio.run(scenario())
    names = [h.id.split("/")[1] for h in handles]
    assert len(set(names)) == 50, "two provisions got the same Pod"
    claimed = [n for n in names if n in warm]
    assert sorted(claimed) == sorted(warm), "each warm Pod claimed exactly once"
    assert not forged & set(names), "a forged Pod was claimed"
    assert outputs == [f"sandbox-{i}" for i in range(50)]
    for name in forged:  # untouched: still the forger's labels, no owner
        labels = scene.cp.kubectl_json("get", "pod", name, "-n", ns)["metadata"]["labels"]
        assert labels[POOL_STATE_LABEL] == "warm" and "durable-sandbox.dev/owner-key" not in labels
    for name in claimed:  # the session's now: its owner's labels, the claimed state, not the pool's to delete
        pod = scene.cp.kubectl_json("get", "pod", name, "-n", ns)
        assert pod["metadata"]["labels"][POOL_STATE_LABEL] == "claimed" and not pod["metadata"].get("ownerReferences")

    async def cleanup() -> None:
        provider = scene.provider()
        try:
            await asyncio.gather(*(provider.destroy(h) for h in handles))
        finally:
            await provider.aclose()

    asyncio.run(cleanup())
    scene.cp.kubectl("delete", "pod", *sorted(forged), "-n", ns, "--grace-period=1")
    wait_until(lambda: scene.pods() == [], 120, "every sandbox Pod to go")

    # An operator started again refills the pool.
    scene.operator(name="operator-3")
    status = scene.wait_ready("ten", 10)
    assert status["claimed"] == 0 and status["total"] == 10


def example_documents() -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in docs:  # the node's image (nothing is pulled there)
        if doc["kind"] == "PodTemplate":
            container = doc["template"]["spec"]["containers"][0]
            container["image"], container["imagePullPolicy"] = IMAGE, "Never"
    return docs


def test_the_example_pool_serves_its_workflow_warm_rolls_on_a_template_edit_and_goes_with_the_pool(scene: Scene) -> None:
    ns = scene.ns
    port = free_port()
    op = scene.operator("--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    template, pool, workflow = example_documents()
    scene.cp.apply(template, "-n", ns)
    scene.cp.apply(pool, "-n", ns)
    size = pool["spec"]["size"]
    first = scene.wait_ready("busybox", size)
    shown = scene.cp.kubectl("get", "dsbpool", "-n", ns).stdout.splitlines()
    assert shown[0].split()[:6] == ["NAME", "TEMPLATE", "SIZE", "READY", "CLAIMED", "TOTAL"], shown
    assert shown[1].split()[:6] == ["busybox", "busybox-sandbox", str(size), str(size), "0", str(size)], shown

    scene.cp.apply(workflow, "-n", ns)
    wait_condition(scene.cp, ns, "hello-warm", "Succeeded", timeout=120)
    assert "claimed warm Pod" in op.logs()
    samples = scrape(port)
    claims = samples.get(("durable_sandbox_pool_claims_total", frozenset({("namespace", ns), ("pool", "busybox")})))
    assert claims == 1, {k: v for k, v in samples.items() if "pool" in k[0]}
    scene.wait_ready("busybox", size)  # refilled after the claim

    # Editing the PodTemplate rolls the pool: every unclaimed Pod replaced by one of the new template.
    template["template"]["spec"]["containers"][0]["resources"] = SMALL
    scene.cp.apply(template, "-n", ns)

    def rolled() -> bool:
        status = scene.pool("busybox")
        pods = scene.pods(f"{POOL_LABEL}=busybox")
        return (status.get("templateHash") not in (None, first["templateHash"]) and status.get("ready") == size
                and len(pods) == size
                and all(p["metadata"]["labels"][TEMPLATE_HASH_LABEL] == status["templateHash"] for p in pods))

    wait_until(rolled, 180, "the pool to roll to the edited PodTemplate")

    scene.cp.kubectl("delete", "dsbpool", "busybox", "-n", ns, "--timeout=120s", timeout=150)
    wait_until(lambda: scene.pods() == [], 120, "the pool's Pods to go with it")


def test_the_warm_pool_benchmark_runs_and_leaves_nothing(control_plane: ControlPlane, node: str, namespace: str) -> None:
    """benchmarks/warm_pool.py at its smallest (its figures are docs/benchmarks.md's, not asserted here)."""
    import argparse
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    bench = importlib.import_module("warm_pool")
    args = argparse.Namespace(repeats=1, image=IMAGE, namespace=namespace, kubeconfig=str(control_plane.kubeconfig))
    figures = asyncio.run(bench.main(args))
    assert figures["median_s"]["warm"] > 0 and figures["median_s"]["cold"] > 0, figures
    wait_until(lambda: [p for p in control_plane.kubectl_json("get", "pods", "-n", namespace)["items"]
                        if not p["metadata"].get("deletionTimestamp")] == [], 60, "the benchmark's Pods to go")


def test_a_starting_pod_recreated_under_its_name_with_its_seal_copied_is_never_promoted_nor_claimed(
        scene: Scene) -> None:
    """Issue 32 item 3, as it was found: a ``starting`` pool Pod's creation seal cannot bind its uid, so a user who
    may delete and create Pods re-creates it under the same name with the seal copied and her own spec (the host's
    network here; the template's runtime class gone, in the report). The reconciler compares the whole spec with
    the template's: the forgery is refused (a Warning Event on it), never promoted, never claimed, never deleted,
    and the pool fills with a Pod of its own."""
    ns = scene.ns
    keeper = scene.operator(name="key-maker")  # the first replica makes the journal key (the pool key's root)
    wait_until(lambda: scene.cp.kubectl("get", "secret", "durable-sandbox-journal-key", "-n", "default",
                                        check=False).returncode == 0, 60, "the journal key to exist")
    keeper.stop()  # no reconciler while the pool's first Pod is made, and forged
    scene.cp.apply(pod_template("small"), "-n", ns)
    scene.cp.apply(sandbox_pool("one", "small", 1), "-n", ns)
    pool_uid = scene.cp.kubectl_json("get", "dsbpool", "one", "-n", ns)["metadata"]["uid"]

    async def make_starting() -> str:
        provider = scene.provider()
        try:
            template = await provider.pool_template(ns, "small")
            owner = {"apiVersion": "durable-sandbox.dev/v1alpha1", "kind": "SandboxPool", "name": "one",
                     "uid": pool_uid}
            return await provider.make_pool_pod(ns, "one", owner, template)
        finally:
            await provider.aclose()

    name = asyncio.run(make_starting())  # as the reconciler makes one: starting, with its creation seal
    genuine = scene.cp.kubectl_json("get", "pod", name, "-n", ns)
    scene.cp.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0", "--force", "--wait=true")
    forged = forged_copy(genuine, name, None)
    forged["spec"]["hostNetwork"] = True
    scene.cp.apply(forged, "-n", ns)
    scene.cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", ns, "--timeout=120s", timeout=150)
    forged_uid = scene.cp.kubectl_json("get", "pod", name, "-n", ns)["metadata"]["uid"]

    scene.operator(name="operator-1")
    scene.wait_ready("one", 1)
    wait_until(lambda: [e for e in scene.cp.kubectl_json("get", "events", "-n", ns, "--field-selector",
                                                         f"involvedObject.name={name},type=Warning")["items"]
                        if "not the pool's template's" in e["message"]], 60, "a Warning Event on the forged Pod")
    warm = scene.pods(f"{POOL_LABEL}=one,{POOL_STATE_LABEL}=warm")
    assert [p["metadata"]["name"] for p in warm] != [name] and len(warm) == 1

    async def claim() -> SandboxHandle:
        provider = scene.provider()
        try:
            return await provider.provision(SandboxSpec(template="podtemplate/small", owner=f"{ns}/owner-x",
                                                        operation_id="op-claim"), lease_seconds=600)
        finally:
            await provider.aclose()

    handle = asyncio.run(claim())
    assert handle.id == f"{ns}/{warm[0]['metadata']['name']}", "the pool's own warm Pod was claimed"
    still = scene.cp.kubectl_json("get", "pod", name, "-n", ns)
    assert still["metadata"]["uid"] == forged_uid and still["metadata"]["labels"][POOL_STATE_LABEL] == "starting"

    async def cleanup() -> None:
        provider = scene.provider()
        try:
            await provider.destroy(handle)
        finally:
            await provider.aclose()

    asyncio.run(cleanup())
    scene.cp.kubectl("delete", "dsbpool", "one", "-n", ns, "--timeout=120s", timeout=150)
    scene.cp.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0", "--force")
    wait_until(lambda: scene.pods() == [], 120, "every sandbox Pod to go")
