"""What one fenced JSON Patch of a ConfigMap costs, by the size of the object: the cost of a journal commit
(the run's head) and of sealing the tail into a chunk, on the same control plane as the operator benchmark.

    python benchmarks/apiserver_patch.py                      # starts the e2e control plane
    python benchmarks/apiserver_patch.py --kubeconfig .dev-cluster/kubeconfig

Each object holds N KiB of 480-byte records (as a head's journal tail or a chunk does); each PATCH is what a
commit sends (``test`` of the fence, ``add`` of a record, ``replace`` of seq). Sizes are measured in
interleaved rounds (each round patches every size) so that load drifting during the run hits all alike; the
median round is reported. Writes ``results/apiserver_patch.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, machine_info, print_table, write_results
from operator_throughput import control_plane, kubectl

SIZES_KIB = (0, 8, 16, 32, 128, 384)


async def measure(kubeconfig: str, namespace: str, rounds: int, per_round: int) -> dict[int, list[float]]:
    from kubernetes.aio.client import models as m

    from durable_sandbox.kube.client import KubeClient, json_body
    from durable_sandbox.kube.resources import JSON_PATCH

    api = await KubeClient.connect(kubeconfig=kubeconfig)
    try:
        for kib in SIZES_KIB:
            data = {f"j.{i:012d}": "x" * 480 for i in range(kib * 2)} | {"fence": "1", "seq": "0"}
            await api.core.create_namespaced_config_map(
                namespace, m.V1ConfigMap(metadata=m.V1ObjectMeta(name=f"patch-{kib}"), data=data))
        ms: dict[int, list[float]] = {kib: [] for kib in SIZES_KIB}
        seq = 0
        for _ in range(rounds):
            for kib in SIZES_KIB:
                t0 = time.perf_counter()
                for _ in range(per_round):
                    seq += 1
                    ops = [{"op": "test", "path": "/data/fence", "value": "1"},
                           {"op": "add", "path": f"/data/r.{seq % 4}", "value": "y" * 480},
                           {"op": "replace", "path": "/data/seq", "value": str(seq)}]
                    await json_body(api.core.patch_namespaced_config_map_without_preload_content(
                        f"patch-{kib}", namespace, ops, field_manager="bench", _content_type=JSON_PATCH), parse=False)
                ms[kib].append(1000 * (time.perf_counter() - t0) / per_round)
        return ms
    finally:
        await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", help="use this running cluster (cluster-admin) instead of starting one")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=12, help="PATCHes per size in each round")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "apiserver_patch.json")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dsb-bench-patch-"))
    try:
        with control_plane(args.kubeconfig, workdir) as kubeconfig:
            namespace = f"bench-patch-{int(time.time())}"
            kubectl(kubeconfig, "create", "namespace", namespace)
            try:
                ms = asyncio.run(measure(kubeconfig, namespace, args.rounds, args.per_round))
            finally:
                kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    res: dict[str, Any] = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                           "ms_per_patch": {str(k): {"median": statistics.median(v), "rounds": v} for k, v in ms.items()}}
    print_table("one fenced JSON Patch of a ConfigMap, by object size (median of interleaved rounds)",
                ["object KiB", "ms per PATCH", "min round", "max round"],
                [[str(k), f"{statistics.median(v):.1f}", f"{min(v):.1f}", f"{max(v):.1f}"] for k, v in ms.items()])
    write_results(res, args.out)


if __name__ == "__main__":
    main()
