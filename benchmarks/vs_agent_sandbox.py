"""Side by side with kubernetes-sigs/agent-sandbox v1.0.1 (issue 37), one run on the test node, interleaved rounds.

Brings up the e2e tier's control plane with its node (tests/e2e/node_support.py, holding the machine's node lock),
agent-sandbox's controller built from the Go module beside it under the RBAC it ships
(tests/e2e/agent_sandbox_support.py) and an S3 server (versitygw on loopback), then measures, both sides on the same
busybox image and the same API server exec client (``providers/kubernetes_exec.PodExec``: theirs as their Python
client's exec path, bare, with no check around it; ours through the kubernetes provider, verified before and after):

* ``warm``: claim to first command done. Theirs: a SandboxClaim on a SandboxWarmPool with Ready sandboxes, waited
  Ready (its claim polled every 10 ms), its Sandbox's Pod found, ``true`` exec'd. Ours: ``provision`` of
  ``podtemplate/<bench>`` claiming a warm Pod as a SandboxPool's reconciler makes them, then a ``true`` call.
* ``cold``: the same with nothing warm: theirs a claim on a pool of 0 replicas (their controller makes the Sandbox
  from the pool's template); ours a provision that makes its Pod.
* ``concurrent``: N cold claims at once (default 20), time until every one has run its first command.
* ``loss``: a sandbox lost mid-task (its Pod or claim deleted by hand after a snapshot and one more call). Theirs:
  what their user does by hand, a new claim (warm) and the command again: time to the next command, and whether the
  workspace came back (it does not: a new sandbox). Ours: the next call's SandboxGone, restore of the last snapshot
  into a new Pod, the call after the snapshot replayed, then the next call: time, and whether the workspace is whole.

Rounds alternate theirs and ours; cleanup (claims, Pods) happens between rounds, untimed. Goal: ours at least 2x
faster warm and cold; only ours recovers the workspace.

    python benchmarks/vs_agent_sandbox.py --rounds 5 --concurrent 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from benchmarks._common import RESULTS_DIR, machine_info  # noqa: E402
from benchmarks.warm_pool import fill  # noqa: E402

from durable_sandbox.providers.contract import SandboxGone, SandboxHandle, SandboxSpec, ToolCall  # noqa: E402
from durable_sandbox.providers.kubernetes import KubernetesProvider  # noqa: E402
from durable_sandbox.providers.kubernetes_pool import derive_pool_key  # noqa: E402
from durable_sandbox.providers.kubernetes_template import PodTemplate  # noqa: E402

EXT_GROUP, EXT_VERSION = "extensions.agents.x-k8s.io", "v1beta1"
EXT = f"{EXT_GROUP}/{EXT_VERSION}"
GOAL_RATIO = 2.0
READY_TIMEOUT_S = 180.0
RESOURCES = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "64Mi"}}


class _Tmp:
    """What ``session_node_cluster`` asks of pytest's tmp_path_factory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=name, dir=self.root))
        return path


@contextlib.contextmanager
def node_with_agent_sandbox(root: Path) -> Iterator[tuple[Any, Any]]:
    from tests.e2e.agent_sandbox_support import run_agent_sandbox
    from tests.e2e.node_support import session_node_cluster

    with contextlib.contextmanager(session_node_cluster)(_Tmp(root)) as cluster:  # type: ignore[arg-type]
        with run_agent_sandbox(cluster, root) as controller:
            yield cluster, controller


class Theirs:
    """agent-sandbox's way: claims on a warm pool through the API, their Pod exec'd."""

    def __init__(self, custom: Any, pod_exec: Any, namespace: str) -> None:
        self.custom, self.exec, self.ns = custom, pod_exec, namespace

    async def claim(self, pool: str) -> str:
        from durable_sandbox.providers.kubernetes_api import json_body

        name = "c-" + secrets.token_hex(4)
        body = {"apiVersion": EXT, "kind": "SandboxClaim", "metadata": {"name": name},
                "spec": {"warmPoolRef": {"name": pool}}}
        await json_body(self.custom.create_namespaced_custom_object_without_preload_content(
            EXT_GROUP, EXT_VERSION, self.ns, "sandboxclaims", body))
        return name

    async def ready_pod(self, claim: str) -> str:
        from durable_sandbox.providers.kubernetes_api import json_body

        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            got = await json_body(self.custom.get_namespaced_custom_object_without_preload_content(
                EXT_GROUP, EXT_VERSION, self.ns, "sandboxclaims", claim))
            ready = [c for c in (got.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
            box = ((got.get("status") or {}).get("sandbox") or {}).get("name")
            if ready and ready[0].get("status") == "True" and box:
                sandbox = await json_body(self.custom.get_namespaced_custom_object_without_preload_content(
                    "agents.x-k8s.io", EXT_VERSION, self.ns, "sandboxes", box))
                return str((sandbox["metadata"].get("annotations") or {}).get("agents.x-k8s.io/pod-name") or box)
            await asyncio.sleep(0.01)
        raise TimeoutError(f"SandboxClaim {self.ns}/{claim} not Ready after {READY_TIMEOUT_S}s")

    async def run(self, pod: str, command: str) -> tuple[int, bytes]:
        out = bytearray()
        outcome = await self.exec.run(self.ns, pod, "main", ["/bin/sh", "-c", command], stdout=out.extend,
                                      stderr=lambda b: None)
        return int(getattr(outcome, "exit_code", 0) or 0), bytes(out)

    async def first_command(self, pool: str) -> tuple[float, str]:
        start = time.perf_counter()
        claim = await self.claim(pool)
        pod = await self.ready_pod(claim)
        code, _ = await self.run(pod, "true")
        assert code == 0
        return time.perf_counter() - start, claim

    async def delete(self, claim: str) -> None:
        from durable_sandbox.providers.kubernetes_api import json_body

        with contextlib.suppress(Exception):
            await json_body(self.custom.delete_namespaced_custom_object_without_preload_content(
                EXT_GROUP, EXT_VERSION, self.ns, "sandboxclaims", claim), parse=False)


async def ours_first_call(provider: KubernetesProvider, spec: SandboxSpec) -> tuple[float, SandboxHandle]:
    start = time.perf_counter()
    handle = await provider.provision(spec.model_copy(update={"operation_id": secrets.token_hex(6)}),
                                      lease_seconds=3600)
    result = await provider.execute(handle, ToolCall(operation_id="first", type="shell", args={"command": "true"}))
    assert result.exit_code == 0, result
    return time.perf_counter() - start, handle


def summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    medians = {k: statistics.median(v) for k, v in samples.items() if v}
    return {"median_s": medians, "ratio_theirs_over_ours": medians["theirs"] / medians["ours"], "samples": samples}


async def wait_pool(cluster: Any, namespace: str, pool: str, replicas: int) -> None:
    from tests.e2e.controlplane import wait_until

    def ready() -> bool:
        got = cluster.kubectl_json("get", "sandboxwarmpool", pool, "-n", namespace)
        return int((got.get("status") or {}).get("readyReplicas", 0)) >= replicas

    await asyncio.to_thread(wait_until, ready, READY_TIMEOUT_S, f"SandboxWarmPool {pool} to have {replicas} Ready")


async def pods_settle(cluster: Any, namespace: str, at_most: int) -> None:
    """Until the namespace has at most ``at_most`` Pods (the last round's are gone): untimed, between rounds."""
    from tests.e2e.controlplane import wait_until

    def settled() -> bool:
        return len(cluster.kubectl_json("get", "pods", "-n", namespace)["items"]) <= at_most

    await asyncio.to_thread(wait_until, settled, READY_TIMEOUT_S, f"the Pods of {namespace} to settle")


async def startup_part(cluster: Any, theirs: Theirs, ours: dict[str, tuple[KubernetesProvider, SandboxSpec]],
                       rounds: int, baseline: int) -> dict[str, Any]:
    """``warm`` and ``cold``: claim to first command, theirs and ours alternating (who goes first, too)."""
    samples: dict[str, dict[str, list[float]]] = {"warm": {"theirs": [], "ours": []},
                                                  "cold": {"theirs": [], "ours": []}}
    preexisting: list[str] = []

    async def one(kind: str, side: str) -> None:
        if side == "theirs":
            if kind == "warm":
                await wait_pool(cluster, theirs.ns, "warm", 1)
            before = {p["metadata"]["name"] for p in cluster.kubectl_json("get", "pods", "-n", theirs.ns)["items"]}
            seconds, claim = await theirs.first_command(kind)
            if kind == "cold" and await theirs.ready_pod(claim) in before:
                preexisting.append(claim)  # not cold: a warm Sandbox was adopted
            await theirs.delete(claim)
        else:
            provider, spec = ours[kind]
            seconds, handle = await ours_first_call(provider, spec)
            await provider.destroy(handle)
        samples[kind][side].append(seconds)
        await pods_settle(cluster, theirs.ns, baseline + rounds + 2)

    for kind in ("warm", "cold"):  # warm-up: connections, the image's page cache, their controller's caches
        for side in ("theirs", "ours"):
            await one(kind, side)
            samples[kind][side].clear()
    preexisting.clear()
    for r in range(rounds):
        for kind in ("warm", "cold"):
            for side in (("theirs", "ours") if r % 2 == 0 else ("ours", "theirs")):
                await one(kind, side)
    out = {kind: summary(by_side) for kind, by_side in samples.items()}
    out["cold"]["theirs_claims_on_a_preexisting_pod"] = len(preexisting)
    return out


async def concurrent_part(cluster: Any, theirs: Theirs, cold: KubernetesProvider, spec: SandboxSpec, n: int,
                          baseline: int) -> dict[str, Any]:
    """``n`` cold claims at once, each to its first command; the makespan and the median of each's time."""
    out: dict[str, Any] = {"n": n}
    start = time.perf_counter()
    theirs_done = await asyncio.gather(*(theirs.first_command("cold") for _ in range(n)), return_exceptions=True)
    theirs_s = time.perf_counter() - start
    ok = [d for d in theirs_done if isinstance(d, tuple)]
    out["theirs"] = {"all_done_s": theirs_s, "median_s": statistics.median(s for s, _ in ok) if ok else None,
                     "failed": [repr(d) for d in theirs_done if not isinstance(d, tuple)]}
    await asyncio.gather(*(theirs.delete(c) for _, c in ok))
    await pods_settle(cluster, theirs.ns, baseline)
    start = time.perf_counter()
    ours_done = await asyncio.gather(*(ours_first_call(cold, spec) for _ in range(n)), return_exceptions=True)
    ours_s = time.perf_counter() - start
    good = [d for d in ours_done if isinstance(d, tuple)]
    out["ours"] = {"all_done_s": ours_s, "median_s": statistics.median(s for s, _ in good) if good else None,
                   "failed": [repr(d) for d in ours_done if not isinstance(d, tuple)]}
    await asyncio.gather(*(cold.destroy(h) for _, h in good), return_exceptions=True)
    await pods_settle(cluster, theirs.ns, baseline)
    out["ratio_theirs_over_ours"] = theirs_s / ours_s
    return out


def shell(command: str) -> ToolCall:
    return ToolCall(operation_id=secrets.token_hex(6), type="shell", args={"command": command})


async def loss_part(cluster: Any, theirs: Theirs, provider: KubernetesProvider, spec: SandboxSpec) -> dict[str, Any]:
    """A sandbox lost mid-task: the time from the loss to the next command done, and whether the workspace is back."""
    expected = "one\ntwo\n"
    # Theirs: the work, the claim deleted by hand, then what their user does: a new claim and the command again.
    await wait_pool(cluster, theirs.ns, "warm", 1)
    claim = await theirs.claim("warm")
    pod = await theirs.ready_pod(claim)
    await theirs.run(pod, "echo one > /tmp/f && echo two >> /tmp/f")
    await theirs.delete(claim)
    await wait_pool(cluster, theirs.ns, "warm", 1)
    start = time.perf_counter()
    again = await theirs.claim("warm")
    _, seen = await theirs.run(await theirs.ready_pod(again), "cat /tmp/f 2>/dev/null; true")
    theirs_s = time.perf_counter() - start
    await theirs.delete(again)
    # Ours: a snapshot after the first call, one more call, the Pod deleted by hand; the next call finds it gone,
    # the last snapshot is restored into a new Pod, the call after it replayed, and the next call runs.
    handle = await provider.provision(spec.model_copy(update={"operation_id": secrets.token_hex(6)}), lease_seconds=3600)
    await provider.execute(handle, shell("echo one > f"))
    snapshot = await provider.snapshot(handle, operation_id=secrets.token_hex(6))
    await provider.execute(handle, shell("echo two >> f"))
    cluster.kubectl("delete", "pod", "-n", theirs.ns, str(handle.metadata["pod"]), "--wait=false")
    start = time.perf_counter()
    gone = False
    try:
        await provider.execute(handle, shell("cat f"))
    except SandboxGone:
        gone = True
    restored = await provider.restore(snapshot, spec.model_copy(update={"operation_id": secrets.token_hex(6)}),
                                      lease_seconds=3600)
    await provider.execute(restored, shell("echo two >> f"))  # the replay of the call after the snapshot
    result = await provider.execute(restored, shell("cat f"))
    ours_s = time.perf_counter() - start
    await provider.destroy(restored)
    await provider.delete_snapshot(snapshot)
    return {"theirs": {"to_next_command_s": theirs_s, "workspace_recovered": seen.decode() == expected,
                       "what_the_user_does": "notices the failure, makes a new claim, redoes the work by hand"},
            "ours": {"to_next_call_s": ours_s, "workspace_recovered": result.stdout == expected,
                     "loss_detected_as_sandbox_gone": gone}}


def their_template(image: str, name: str) -> dict[str, Any]:
    return {"apiVersion": EXT, "kind": "SandboxTemplate", "metadata": {"name": name}, "spec": {
        "podTemplate": {"spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": image, "imagePullPolicy": "Never", "resources": RESOURCES,
            "command": ["/bin/sh", "-c", "exec sleep 36000"]}]}}}}


async def measure(cluster: Any, namespace: str, image: str, args: argparse.Namespace, store: Any) -> dict[str, Any]:
    from kubernetes.aio import client as k8s

    from durable_sandbox.providers.kubernetes_api import json_body, load_configuration
    from durable_sandbox.providers.kubernetes_exec import PodExec

    # The cold pool has a template of its own (the same Pod): a claim adopts a warm Sandbox of its template from
    # any pool, so with one template the cold claims took the warm pool's Sandboxes (the first run, 2026-12-07).
    for pool, replicas in (("warm", 2), ("cold", 0)):
        cluster.apply(their_template(image, f"busybox-{pool}"), "-n", namespace)
        cluster.apply({"apiVersion": EXT, "kind": "SandboxWarmPool", "metadata": {"name": pool},
                       "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": f"busybox-{pool}"}}},
                      "-n", namespace)
    await wait_pool(cluster, namespace, "warm", 2)
    template = PodTemplate.model_validate({"image": image, "imagePullPolicy": "Never", "resources": RESOURCES})
    where: dict[str, Any] = {"kubeconfig": str(cluster.kubeconfig), "namespace": namespace, "environ": {},
                             "template": template}
    warm = KubernetesProvider(**where, pool_key=derive_pool_key(secrets.token_bytes(32)))
    cold = KubernetesProvider(**where, store=store)
    api = k8s.ApiClient(await load_configuration(kubeconfig=str(cluster.kubeconfig)))
    theirs = Theirs(k8s.CustomObjectsApi(api), PodExec(api), namespace)
    name = "dsb-bench-" + secrets.token_hex(4)
    body = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": {"spec": {
        "containers": [{"name": "sandbox", "image": image, "imagePullPolicy": "Never", "resources": RESOURCES}]}}}
    created = await json_body(k8s.CoreV1Api(api).create_namespaced_pod_template_without_preload_content(namespace, body))
    owner = {"apiVersion": "v1", "kind": "PodTemplate", "name": name, "uid": created["metadata"]["uid"]}
    spec = SandboxSpec(owner=f"{namespace}/bench")
    results: dict[str, Any] = {}
    try:
        await fill(warm, namespace, name, owner, args.rounds + 2)
        baseline = len(cluster.kubectl_json("get", "pods", "-n", namespace)["items"])
        ours = {"warm": (warm, spec.model_copy(update={"template": f"podtemplate/{name}"})), "cold": (cold, spec)}
        results["startup"] = await startup_part(cluster, theirs, ours, args.rounds, baseline)
        results["loss"] = await loss_part(cluster, theirs, cold, spec)
        baseline = len(cluster.kubectl_json("get", "pods", "-n", namespace)["items"])
        results["concurrent"] = await concurrent_part(cluster, theirs, cold, spec, args.concurrent, baseline)
    finally:
        for provider in (warm, cold):
            await provider.aclose()
        await api.close()
    return results


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from tests.e2e.controlplane import fresh_namespace
    from tests.e2e.sandbox_support import sandbox_image
    from tests.objectstore import S3Server, install_versitygw

    from durable_sandbox.providers.s3_snapshots import S3SnapshotStore

    with tempfile.TemporaryDirectory(prefix="dsb-vs-asb-", dir=args.tmp) as tmp:
        root = Path(tmp)
        server = S3Server(binary=install_versitygw(), data=root / "s3", log=root / "s3.log")
        server.start()
        store = S3SnapshotStore(server.config("bench"))
        try:
            await store.ensure_bucket()
            with node_with_agent_sandbox(root) as (cluster, controller):
                build = Path(controller.k8s).parent
                with fresh_namespace(cluster, "vs-asb") as namespace:
                    results = await measure(cluster, namespace, sandbox_image(cluster), args, store)
        finally:
            await store.aclose()
            server.stop()
    warm, cold = results["startup"]["warm"], results["startup"]["cold"]
    return {"machine": machine_info(), "versions": {"agent-sandbox": "v1.0.1 (sigs.k8s.io/agent-sandbox, "
                                                                     f"controller built in {build.name})",
                                                    "durable-sandbox": _our_version()},
            "rounds": args.rounds, **results,
            "goal": {"ratio_at_least": GOAL_RATIO, "only_ours_recovers": True},
            "met": (warm["ratio_theirs_over_ours"] >= GOAL_RATIO and cold["ratio_theirs_over_ours"] >= GOAL_RATIO
                    and results["loss"]["ours"]["workspace_recovered"]
                    and not results["loss"]["theirs"]["workspace_recovered"])}


def _our_version() -> str:
    import subprocess

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    from durable_sandbox import __version__

    return f"{__version__} ({commit or 'no git'})"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument("--tmp", default=None, help="where the S3 store's data goes (needs user xattrs)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "vs_agent_sandbox.json")
    ns = parser.parse_args()
    figures = asyncio.run(main(ns))
    ns.out.write_text(json.dumps(figures, indent=2) + "\n")
    brief = {k: figures[k] for k in ("versions", "goal", "met", "loss", "concurrent")}
    brief["startup"] = {k: {"median_s": v["median_s"], "ratio": v["ratio_theirs_over_ours"]}
                        for k, v in figures["startup"].items()}
    print(json.dumps(brief, indent=2))
