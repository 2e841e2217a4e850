"""Warm Pods vs cold: provision to the first call done, through the kubernetes provider, both in one run.

* ``warm``: ``provision`` of ``podtemplate/<bench template>`` claims a warm Pod (one list, one conditional patch),
  then one ``true`` call.
* ``cold``: the same provision by a provider without the pool key (every provision a miss), which makes the Pod,
  waits for it to run and checks its image, then the same call.

The warm Pods are made before the timed part exactly as a SandboxPool's reconciler makes them
(``make_pool_pod``, then ``promote_pool_pod`` once running: the probe and the warm seal), owned by the benchmark's
PodTemplate, so deleting it (at the end) takes any that are left. Warm and cold alternate, so load changes hit both.
Goal (issue 27): warm at least 5x faster than cold and under 300 ms on the test node.

    eval "$(scripts/dev-cluster up)" && scripts/dev-cluster load-image   # or any cluster with a Ready node
    python benchmarks/warm_pool.py --image localhost/busybox:dsb-test --namespace default
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import RESULTS_DIR, machine_info

from durable_sandbox.providers.contract import SandboxHandle, SandboxSpec, ToolCall
from durable_sandbox.providers.kubernetes import KubernetesProvider
from durable_sandbox.providers.kubernetes_pool import derive_pool_key
from durable_sandbox.providers.kubernetes_template import PodTemplate

GOAL_RATIO, GOAL_WARM_S = 5.0, 0.3
RESOURCES = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "64Mi"}}


async def first_call(provider: KubernetesProvider, spec: SandboxSpec) -> tuple[float, SandboxHandle]:
    start = time.perf_counter()
    handle = await provider.provision(spec, lease_seconds=600)
    result = await provider.execute(handle, ToolCall(operation_id="first", type="shell", args={"command": "true"}))
    seconds = time.perf_counter() - start
    assert result.exit_code == 0, result
    return seconds, handle


async def fill(provider: KubernetesProvider, namespace: str, template_name: str, owner: dict[str, str],
               n: int, timeout: float = 180) -> None:
    """``n`` warm Pods of the template, as a pool's reconciler makes them."""
    template = await provider.pool_template(namespace, template_name)
    names = [await provider.make_pool_pod(namespace, "bench", owner, template) for _ in range(n)]
    pending, deadline = set(names), time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"warm Pods not running after {timeout}s: {sorted(pending)}")
        for pod in await provider.pool_pods(namespace, "bench"):
            name = pod["metadata"]["name"]
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            if name in pending and statuses and "running" in (statuses[0].get("state") or {}):
                if await provider.promote_pool_pod(pod, "bench"):
                    pending.discard(name)
        await asyncio.sleep(0.1)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes.aio import client as k8s

    from durable_sandbox.providers.kubernetes_api import json_body, load_configuration

    key = derive_pool_key(secrets.token_bytes(32))
    template = PodTemplate(image=args.image, imagePullPolicy="IfNotPresent")
    where = {"kubeconfig": args.kubeconfig, "namespace": args.namespace, "environ": {}, "template": template}
    warm = KubernetesProvider(**where, pool_key=key)
    cold = KubernetesProvider(**where)
    name = "dsb-bench-" + secrets.token_hex(4)
    api = k8s.ApiClient(await load_configuration(kubeconfig=args.kubeconfig))
    core = k8s.CoreV1Api(api)
    body = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": {"spec": {
        "containers": [{"name": "sandbox", "image": args.image, "imagePullPolicy": "IfNotPresent",
                        "resources": RESOURCES}]}}}
    created = await json_body(core.create_namespaced_pod_template_without_preload_content(args.namespace, body))
    owner = {"apiVersion": "v1", "kind": "PodTemplate", "name": name, "uid": created["metadata"]["uid"]}
    samples: dict[str, list[float]] = {"warm": [], "cold": []}
    handles: list[tuple[KubernetesProvider, SandboxHandle]] = []
    try:
        await fill(warm, args.namespace, name, owner, args.repeats + 1)
        spec = SandboxSpec(template=f"podtemplate/{name}", owner=f"{args.namespace}/bench")
        for provider in (warm, cold):  # warm-up: connections, TLS, the image's page cache
            handles.append((provider, (await first_call(provider, spec.model_copy(
                update={"operation_id": secrets.token_hex(6)})))[1]))
        for _ in range(args.repeats):
            for label, provider in (("warm", warm), ("cold", cold)):
                seconds, handle = await first_call(provider, spec.model_copy(update={"operation_id": secrets.token_hex(6)}))
                samples[label].append(seconds)
                handles.append((provider, handle))
    finally:
        await asyncio.gather(*(p.destroy(h) for p, h in handles), return_exceptions=True)
        await json_body(core.delete_namespaced_pod_template_without_preload_content(name, args.namespace), parse=False)
        for p in (warm, cold):
            await p.aclose()
        await api.close()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratio = medians["cold"] / medians["warm"]
    return {"machine": machine_info(), "median_s": medians, "ratio_cold_over_warm": ratio,
            "goal": {"ratio_at_least": GOAL_RATIO, "warm_under_s": GOAL_WARM_S},
            "met": ratio >= GOAL_RATIO and medians["warm"] < GOAL_WARM_S, "samples": samples}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--image", default="docker.io/library/busybox:1.36")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "warm_pool.json")
    ns = parser.parse_args()
    figures = asyncio.run(main(ns))
    ns.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: figures[k] for k in ("median_s", "ratio_cold_over_warm", "goal", "met")}, indent=2))
