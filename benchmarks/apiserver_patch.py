"""What one fenced JSON Patch costs, by the size of the object and by its kind: the cost of a journal commit
(the run's head) and of sealing the tail into a chunk, on the same control plane as the operator benchmark.
Both kinds the journal has lived in are measured in the same rounds: a ConfigMap (the first version) and a
``Journal`` (the operator's own kind, issue 20), so the report gives the price of the move as a ratio.

    python benchmarks/apiserver_patch.py                      # starts the e2e control plane
    python benchmarks/apiserver_patch.py --kubeconfig .dev-cluster/kubeconfig

Each object holds N KiB of 480-byte records (as a head's journal tail or a chunk does); each PATCH is what a
commit sends (``test`` of the fence, ``add`` of a record, ``replace`` of seq). Sizes and kinds are measured in
interleaved rounds (each round patches every size of both kinds) so that load drifting during the run hits
all alike; the median round is reported. Writes ``results/apiserver_patch.json``.
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
from operator_throughput import ROOT, control_plane, kubectl

SIZES_KIB = (0, 8, 16, 32, 128, 384)


KINDS = ("configmap", "journal")


async def measure(kubeconfig: str, namespace: str, rounds: int, per_round: int) -> dict[str, dict[int, list[float]]]:
    from kubernetes.aio.client import models as m

    from durable_sandbox.kube.api.client import KubeClient, json_body
    from durable_sandbox.kube.api.resources import API_VERSION, GROUP, JOURNALS, JSON_PATCH, VERSION

    api = await KubeClient.connect(kubeconfig=kubeconfig)

    def patch(kind: str, name: str, ops: list[dict[str, str]]) -> Any:
        if kind == "configmap":
            return api.core.patch_namespaced_config_map_without_preload_content(
                name, namespace, ops, field_manager="bench", _content_type=JSON_PATCH)
        return api.custom.patch_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, JOURNALS, name, ops, field_manager="bench", _content_type=JSON_PATCH)

    try:
        for kib in SIZES_KIB:
            data = {f"j.{i:012d}": "x" * 480 for i in range(kib * 2)} | {"fence": "1", "seq": "0"}
            await api.core.create_namespaced_config_map(
                namespace, m.V1ConfigMap(metadata=m.V1ObjectMeta(name=f"patch-{kib}"), data=data))
            await api.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "journals", {
                "apiVersion": API_VERSION, "kind": "Journal", "metadata": {"name": f"patch-{kib}"},
                "run": "bench", "part": "run", "data": data})
        ms: dict[str, dict[int, list[float]]] = {kind: {kib: [] for kib in SIZES_KIB} for kind in KINDS}
        seq = 0
        for _ in range(rounds):
            for kib in SIZES_KIB:
                for kind in KINDS:
                    t0 = time.perf_counter()
                    for _ in range(per_round):
                        seq += 1
                        ops = [{"op": "test", "path": "/data/fence", "value": "1"},
                               {"op": "add", "path": f"/data/r.{seq % 4}", "value": "y" * 480},
                               {"op": "replace", "path": "/data/seq", "value": str(seq)}]
                        await json_body(patch(kind, f"patch-{kib}", ops), parse=False)
                    ms[kind][kib].append(1000 * (time.perf_counter() - t0) / per_round)
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
            kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
            kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/journals.durable-sandbox.dev",
                    "--timeout=60s")
            kubectl(kubeconfig, "create", "namespace", namespace)
            try:
                ms = asyncio.run(measure(kubeconfig, namespace, args.rounds, args.per_round))
            finally:
                kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    med = {kind: {k: statistics.median(v) for k, v in by_size.items()} for kind, by_size in ms.items()}
    res: dict[str, Any] = {
        "machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
        "ms_per_patch": {kind: {str(k): {"median": med[kind][k], "rounds": v} for k, v in by_size.items()}
                         for kind, by_size in ms.items()},
        "journal_vs_configmap": {str(k): round(med["journal"][k] / med["configmap"][k], 3) for k in SIZES_KIB},
    }
    print_table("one fenced JSON Patch, by object size and kind (median of interleaved rounds)",
                ["object KiB", "ConfigMap ms", "Journal ms", "Journal / ConfigMap"],
                [[str(k), f"{med['configmap'][k]:.1f}", f"{med['journal'][k]:.1f}",
                  f"{med['journal'][k] / med['configmap'][k]:.2f}x"] for k in SIZES_KIB])
    write_results(res, args.out)


if __name__ == "__main__":
    main()
