"""Where a kubernetes provision's time goes, phase by phase: warm claim and cold create, each to its first call.

Brings up the e2e tier's control plane and node (tests/e2e/node_support.py, holding the machine's node lock), fills
a few warm Pods as a SandboxPool's reconciler makes them, then alternates ``rounds`` warm and cold provisions, each
followed by a ``true`` call (what ``benchmarks/vs_agent_sandbox.py`` times as "claim → first command"). Every
provider step of interest is wrapped in this process (the instance's methods, the wait's function) and its wall
time recorded; a Pod watch
running beside it records when the API server first showed each cold Pod's container running, so the time from
"running" to "the provider noticed" is measured, not guessed. Nested phases are reported inside their parent (the
``first call`` includes its two Pod reads and its exec).

    python benchmarks/claim_phases.py --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from benchmarks._common import RESULTS_DIR, machine_info  # noqa: E402
from benchmarks.warm_pool import fill  # noqa: E402

from durable_sandbox.providers.contract import SandboxSpec, ToolCall  # noqa: E402
from durable_sandbox.providers.kubernetes import KubernetesProvider  # noqa: E402
from durable_sandbox.providers.kubernetes_pool import derive_pool_key  # noqa: E402
from durable_sandbox.providers.kubernetes_template import PodTemplate  # noqa: E402

RESOURCES = {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "64Mi"}}
# Provider methods timed (those a version lacks are skipped): what each is, as reported.
PHASES = {
    "_template_for": "PodTemplate read",
    "_claim_warm": "warm claim (list + conditional patch)",
    "_pods": "  Pod list",
    "_create_pod": "Pod create",
    "_wait_ready": "wait until running",
    "_probe": "image check (exec)",
    "_seal": "seal patch",
    "_verify_pod": "Pod read around an exec",
    "_read_pod": "Pod read",
}


class Recorder:
    """Wall time of each wrapped call, per round; nested calls are recorded too (they overlap their parent)."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    def wrap(self, obj: Any, attribute: str, label: str) -> None:
        inner: Callable[..., Awaitable[Any]] = getattr(obj, attribute)

        @functools.wraps(inner)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                self.ended[label] = time.perf_counter()
                self.current[label] = self.current.get(label, 0.0) + self.ended[label] - start

        setattr(obj, attribute, timed)

    def instrument(self, provider: KubernetesProvider) -> None:
        for attribute, label in PHASES.items():
            if hasattr(provider, attribute):
                self.wrap(provider, attribute, label)
        # Since the watch (2026-12-07), the wait is a function of its own module, called through this one's name.
        from durable_sandbox.providers import kubernetes_provisioning

        if hasattr(kubernetes_provisioning, "wait_running"):
            self.wrap(kubernetes_provisioning, "wait_running", PHASES["_wait_ready"])

    def instrument_exec(self, provider: KubernetesProvider) -> None:
        assert provider._exec is not None
        self.wrap(provider._exec, "run", "exec (websocket: open, run, status)")


async def running_times(core: Any, namespace: str, seen: dict[str, float], stop: asyncio.Event) -> None:
    """When the API server first showed each Pod's container running (perf_counter), from a watch."""
    from kubernetes.aio import watch

    while not stop.is_set():
        w = watch.Watch()
        with contextlib.suppress(Exception):
            async for event in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=30,
                                        _request_timeout=35):
                pod = event["object"]
                for cs in (pod.status.container_statuses or []) if pod.status else []:
                    if cs.state and cs.state.running and pod.metadata.name not in seen:
                        seen[pod.metadata.name] = time.perf_counter()
                if stop.is_set():
                    break
        await w.close()


async def one(provider: KubernetesProvider, spec: SandboxSpec, recorder: Recorder,
              running: dict[str, float]) -> dict[str, float]:
    recorder.current, recorder.ended = {}, {}
    start = time.perf_counter()
    handle = await provider.provision(spec.model_copy(update={"operation_id": secrets.token_hex(6)}),
                                      lease_seconds=3600)
    provisioned = time.perf_counter()
    recorder.current.pop("exec (websocket: open, run, status)", None)  # the probe's, inside "image check"
    reads = recorder.current.pop("Pod read around an exec", 0.0)
    recorder.current.pop("Pod read", None)
    call_start = time.perf_counter()
    result = await provider.execute(handle, ToolCall(operation_id="first", type="shell", args={"command": "true"}))
    done = time.perf_counter()
    assert result.exit_code == 0, result
    phases = dict(recorder.current)
    phases["provision (all)"] = provisioned - start
    phases["first call (all)"] = done - call_start
    phases["  of it: Pod reads around the exec"] = recorder.current.get("Pod read around an exec", 0.0)
    if reads:
        phases["  image check's Pod reads"] = reads
    phases.pop("Pod read around an exec", None)
    phases.pop("Pod read", None)
    phases["claim → first call done"] = done - start
    pod = str(handle.metadata["pod"])
    if pod in running and "wait until running" in recorder.ended:
        phases["  running (API server) → noticed"] = recorder.ended["wait until running"] - running[pod]
    await provider.destroy(handle)
    return phases


def table(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = list(dict.fromkeys(k for r in rounds for k in r))
    return {k: {"median_ms": 1000 * statistics.median(r[k] for r in rounds if k in r),
                "min_ms": 1000 * min(r[k] for r in rounds if k in r),
                "max_ms": 1000 * max(r[k] for r in rounds if k in r)} for k in keys}


async def measure(cluster: Any, namespace: str, image: str, rounds: int) -> dict[str, Any]:
    from kubernetes.aio import client as k8s

    from durable_sandbox.providers.kubernetes_api import json_body, load_configuration

    template = PodTemplate.model_validate({"image": image, "imagePullPolicy": "Never", "resources": RESOURCES})
    where: dict[str, Any] = {"kubeconfig": str(cluster.kubeconfig), "namespace": namespace, "environ": {},
                             "template": template}
    warm = KubernetesProvider(**where, pool_key=derive_pool_key(secrets.token_bytes(32)))
    cold = KubernetesProvider(**where)
    api = k8s.ApiClient(await load_configuration(kubeconfig=str(cluster.kubeconfig)))
    core = k8s.CoreV1Api(api)
    name = "dsb-phases-" + secrets.token_hex(4)
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": {"spec": {
        "containers": [{"name": "sandbox", "image": image, "imagePullPolicy": "Never", "resources": RESOURCES}]}}}
    created = await json_body(core.create_namespaced_pod_template_without_preload_content(namespace, body))
    owner = {"apiVersion": "v1", "kind": "PodTemplate", "name": name, "uid": created["metadata"]["uid"]}
    spec = SandboxSpec(owner=f"{namespace}/phases")
    specs = {"warm": (warm, spec.model_copy(update={"template": f"podtemplate/{name}"})), "cold": (cold, spec)}
    running: dict[str, float] = {}
    stop = asyncio.Event()
    watcher = asyncio.create_task(running_times(core, namespace, running, stop))
    samples: dict[str, list[dict[str, float]]] = {"warm": [], "cold": []}
    try:
        await fill(warm, namespace, name, owner, rounds + 1)
        recorders = {kind: Recorder() for kind in specs}
        for kind, (provider, s) in specs.items():
            recorders[kind].instrument(provider)
            await one(provider, s, recorders[kind], running)  # warm-up (connections, caches), discarded
            recorders[kind].instrument_exec(provider)
        for _ in range(rounds):
            for kind, (provider, s) in specs.items():
                samples[kind].append(await one(provider, s, recorders[kind], running))
    finally:
        stop.set()
        watcher.cancel()
        with contextlib.suppress(BaseException):
            await watcher
        for provider in (warm, cold):
            await provider.aclose()
        await api.close()
    return {kind: table(r) for kind, r in samples.items()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from tests.e2e.controlplane import fresh_namespace
    from tests.e2e.node_support import session_node_cluster
    from tests.e2e.sandbox_support import sandbox_image

    class Tmp:
        def __init__(self, root: Path) -> None:
            self.root = root

        def mktemp(self, name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=name, dir=self.root))

    with tempfile.TemporaryDirectory(prefix="dsb-phases-") as tmp:
        with contextlib.contextmanager(session_node_cluster)(Tmp(Path(tmp))) as cluster:  # type: ignore[arg-type]
            with fresh_namespace(cluster, "phases") as namespace:
                results = await measure(cluster, namespace, sandbox_image(cluster), args.rounds)
    return {"machine": machine_info(), "rounds": args.rounds, **results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "claim_phases.json")
    ns = parser.parse_args()
    figures = asyncio.run(main(ns))
    ns.out.write_text(json.dumps(figures, indent=2) + "\n")
    for kind in ("warm", "cold"):
        print(f"\n{kind}: median ms (min-max) over {ns.rounds}")
        for phase, v in figures[kind].items():
            print(f"  {phase:45s} {v['median_ms']:8.1f}  ({v['min_ms']:.0f}-{v['max_ms']:.0f})")
