"""The kubernetes provider: what a tool call, a Pod and a snapshot cost, each beside its baseline in one run.

* ``call``: a no-op shell call (``true``) through the provider vs a bare exec round trip of ``true`` through the
  same API server and Pod (goal: at most 1.25x), and vs the same call without the two Pod reads that make sure
  each exec goes to the sealed Pod (``verification_ratio``: what that check costs).
* ``startup``: Pod create to the first call done (goal: under 2 s on the test node).
* ``snapshot``: snapshot and restore of 10 MB and 200 MB workspaces (MB/s), with the Python heap's peak while
  each runs (tracemalloc): it must not grow with the size.
* ``isolation``: the same sandbox under a sandboxing RuntimeClass (``--runtime-class``, default gvisor) vs runc,
  interleaved: Pod create to the first call done, and a no-op call, as ratios (gVisor's price).
* ``store``: the S3 snapshot store alone, put and get of the same sizes (no node needed): the part of a snapshot
  that is the store's.

The store is a versitygw the script starts on loopback (tests/objectstore.py); the node parts need
``KUBECONFIG`` for a cluster with a Ready node and ``--image`` present on it.

    python benchmarks/kubernetes_provider.py --parts store
    python benchmarks/kubernetes_provider.py --image docker.io/library/busybox:1.36 --namespace default
    python benchmarks/kubernetes_provider.py --parts isolation --runtime-class gvisor
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import json
import pstats
import secrets
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import RESULTS_DIR, machine_info

from durable_sandbox.providers.contract import SandboxSpec, ToolCall
from durable_sandbox.providers.kubernetes import KubernetesProvider
from durable_sandbox.providers.kubernetes_template import CONTAINER, PodTemplate
from durable_sandbox.providers.s3_snapshots import S3SnapshotStore, SnapshotName

MB = 1_000_000


async def generated(total: int) -> AsyncIterator[bytes]:
    block = hashlib.sha256(b"bench").digest() * 2048
    for i in range(0, total, len(block)):
        yield block[: min(len(block), total - i)]


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, int]:
    """Seconds of one ``fn()``, and the Python heap's peak (bytes above what was allocated before) of another:
    tracing slows allocation down, so the time is taken untraced."""
    start = time.perf_counter()
    await fn()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    try:
        await fn()
        return seconds, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


async def store_part(store: S3SnapshotStore, sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        name = SnapshotName.for_operation(f"bench-{size}-{secrets.token_hex(4)}", installation="bench", owner=None,
                                          retained=False)

        async def put() -> None:
            await store.delete(name)  # noqa: B023  (each taking stores anew)
            assert await store.put(name, generated(size))  # noqa: B023

        put_s, put_peak = await timed(put)

        async def drain() -> None:
            async for _ in await store.get(name):  # noqa: B023
                pass

        get_s, get_peak = await timed(drain)
        await store.delete(name)
        out[f"{size // MB}MB"] = {"put_MBps": size / MB / put_s, "get_MBps": size / MB / get_s,
                                  "put_heap_peak_MB": put_peak / MB, "get_heap_peak_MB": get_peak / MB}
    return out


async def call_part(provider: KubernetesProvider, namespace: str, repeats: int) -> dict[str, Any]:
    handle = await provider.provision(SandboxSpec(owner=f"{namespace}/bench"), lease_seconds=3600)
    try:
        assert provider._exec is not None
        pod = handle.metadata["pod"]

        async def bare() -> None:
            await provider._exec.run(namespace, pod, CONTAINER, ["true"], stdout=lambda b: None,  # type: ignore[union-attr]
                                     stderr=lambda b: None)

        async def through() -> None:
            result = await provider.execute(handle, ToolCall(operation_id=secrets.token_hex(6), type="shell",
                                                             args={"command": "true"}))
            assert result.exit_code == 0, result

        verify = provider._verify_pod

        async def unverified() -> None:
            # The same call without the Pod reads that bracket each exec (kubernetes_verification.py): what the
            # check costs, measured beside it in this run.
            async def skip(*_: Any, **__: Any) -> None:
                return None

            provider._verify_pod = skip  # type: ignore[method-assign]
            try:
                await through()
            finally:
                provider._verify_pod = verify  # type: ignore[method-assign]

        for fn in (bare, through, unverified):  # warm-up: connections, TLS, the image's page cache
            await fn()
        samples: dict[str, list[float]] = {"bare_exec": [], "provider_call": [], "provider_call_unverified": []}
        for _ in range(repeats):  # interleaved, so load changes hit all alike
            for key, fn in (("bare_exec", bare), ("provider_call", through), ("provider_call_unverified", unverified)):
                start = time.perf_counter()
                await fn()
                samples[key].append(time.perf_counter() - start)
        medians = {k: statistics.median(v) for k, v in samples.items()}
        return {"median_s": medians, "ratio": medians["provider_call"] / medians["bare_exec"], "goal_ratio": 1.25,
                "verification_ratio": medians["provider_call"] / medians["provider_call_unverified"],
                "verification_s": medians["provider_call"] - medians["provider_call_unverified"], "samples": samples}
    finally:
        await provider.destroy(handle)


async def startup_part(provider: KubernetesProvider, namespace: str, repeats: int) -> dict[str, Any]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        handle = await provider.provision(SandboxSpec(owner=f"{namespace}/bench"), lease_seconds=600)
        await provider.execute(handle, ToolCall(operation_id="first", type="shell", args={"command": "true"}))
        samples.append(time.perf_counter() - start)
        await provider.destroy(handle)
    return {"median_s": statistics.median(samples), "goal_s": 2.0, "samples": samples}


async def isolation_part(plain: KubernetesProvider, isolated: KubernetesProvider, namespace: str,
                         repeats: int) -> dict[str, Any]:
    """Startup (create to first call done) and a no-op call, runc vs the RuntimeClass, interleaved."""
    samples: dict[str, list[float]] = {"runc_startup": [], "isolated_startup": [], "runc_call": [], "isolated_call": []}

    async def one(provider: KubernetesProvider, key: str) -> None:
        start = time.perf_counter()
        handle = await provider.provision(SandboxSpec(owner=f"{namespace}/bench"), lease_seconds=600)
        try:
            await provider.execute(handle, ToolCall(operation_id="first", type="shell", args={"command": "true"}))
            samples[f"{key}_startup"].append(time.perf_counter() - start)
            for _ in range(3):
                begin = time.perf_counter()
                result = await provider.execute(handle, ToolCall(operation_id=secrets.token_hex(6), type="shell",
                                                                 args={"command": "true"}))
                assert result.exit_code == 0, result
                samples[f"{key}_call"].append(time.perf_counter() - begin)
        finally:
            await provider.destroy(handle)

    await one(plain, "runc")  # warm-up: connections, the image's page cache
    await one(isolated, "isolated")
    for values in samples.values():
        values.clear()
    for _ in range(repeats):
        await one(plain, "runc")
        await one(isolated, "isolated")
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {"median_s": medians, "startup_ratio": medians["isolated_startup"] / medians["runc_startup"],
            "call_ratio": medians["isolated_call"] / medians["runc_call"], "samples": samples}


async def snapshot_part(provider: KubernetesProvider, namespace: str, sizes: list[int]) -> dict[str, Any]:
    return {f"{size // MB}MB": await snapshot_one(provider, SandboxSpec(owner=f"{namespace}/bench"), size)
            for size in sizes}


async def snapshot_one(provider: KubernetesProvider, spec: SandboxSpec, size: int) -> dict[str, Any]:
    handle = await provider.provision(spec, lease_seconds=3600)
    snap: dict[str, str] = {}
    restored: dict[str, Any] = {}

    async def take() -> None:
        if "id" in snap:
            await provider.delete_snapshot(snap["id"])
        snap["id"] = await provider.snapshot(handle, operation_id=f"bench-{size}-{secrets.token_hex(4)}")

    async def back() -> None:
        if "h" in restored:
            await provider.destroy(restored["h"])
        restored["h"] = await provider.restore(snap["id"], spec, lease_seconds=600)

    try:
        made = await provider.execute(handle, ToolCall(operation_id="fill", type="shell", args={
            "command": f"head -c {size} /dev/urandom > blob && sync"}))
        assert made.exit_code == 0, made
        snap_s, snap_peak = await timed(take)
        restore_s, restore_peak = await timed(back)
    finally:
        if "h" in restored:
            await provider.destroy(restored["h"])
        if "id" in snap:
            await provider.delete_snapshot(snap["id"])
        await provider.destroy(handle)
    return {"snapshot_MBps": size / MB / snap_s, "restore_MBps": size / MB / restore_s, "snapshot_s": snap_s,
            "restore_s": restore_s, "snapshot_heap_peak_MB": snap_peak / MB, "restore_heap_peak_MB": restore_peak / MB}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from tests.objectstore import S3Server, install_versitygw

    results: dict[str, Any] = {"machine": machine_info(), "parts": {}}
    with tempfile.TemporaryDirectory(prefix="dsb-bench-s3-", dir=args.tmp) as tmp:
        server = S3Server(binary=install_versitygw(), data=Path(tmp) / "data", log=Path(tmp) / "log")
        server.start()
        store = S3SnapshotStore(server.config("bench"))
        try:
            await store.ensure_bucket()
            sizes = [s * MB for s in args.sizes]
            if "store" in args.parts:
                results["parts"]["store"] = await store_part(store, sizes)
            node_parts = [p for p in args.parts if p != "store"]
            if node_parts:
                provider = KubernetesProvider(namespace=args.namespace, environ={}, store=store,
                                              template=PodTemplate(image=args.image, imagePullPolicy="IfNotPresent"))
                try:
                    profiler = cProfile.Profile() if args.profile else None
                    if profiler:
                        profiler.enable()
                    if "call" in node_parts:
                        results["parts"]["call"] = await call_part(provider, args.namespace, args.repeats)
                    if "startup" in node_parts:
                        results["parts"]["startup"] = await startup_part(provider, args.namespace, args.repeats)
                    if "snapshot" in node_parts:
                        results["parts"]["snapshot"] = await snapshot_part(provider, args.namespace, sizes)
                    if "isolation" in node_parts:
                        isolated = KubernetesProvider(namespace=args.namespace, environ={}, template=PodTemplate(
                            image=args.image, imagePullPolicy="IfNotPresent", runtimeClassName=args.runtime_class))
                        try:
                            results["parts"]["isolation"] = {"runtimeClass": args.runtime_class, **await isolation_part(
                                provider, isolated, args.namespace, max(3, args.repeats // 4))}
                        finally:
                            await isolated.aclose()
                    if profiler:
                        profiler.disable()
                        with (RESULTS_DIR / "kubernetes_provider_profile.txt").open("w") as f:
                            pstats.Stats(profiler, stream=f).sort_stats("cumulative").print_stats(40)
                finally:
                    await provider.aclose()
        finally:
            await store.aclose()
            server.stop()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["store", "call", "startup", "snapshot"],
                        choices=["store", "call", "startup", "snapshot", "isolation"])
    parser.add_argument("--runtime-class", default="gvisor", help="the isolation part's RuntimeClass")
    parser.add_argument("--sizes", nargs="+", type=int, default=[10, 200], help="workspace sizes, MB")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--image", default="docker.io/library/busybox:1.36")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--tmp", default=None, help="where the store's data directory goes (needs user xattrs)")
    parser.add_argument("--profile", action="store_true", help="cProfile the node parts into results/")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "kubernetes_provider.json")
    ns = parser.parse_args()
    figures = asyncio.run(main(ns))
    ns.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures["parts"], indent=2))
