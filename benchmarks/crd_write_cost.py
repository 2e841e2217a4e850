"""What the Workflow CRD's validation costs on writes to a big Workflow: create, a status patch (what the
operator writes while a run goes) and a patch of the Workflow itself (a finalizer, a signal), timed on a local
control plane for the shipped CRD beside the same CRD with no CEL rules at all (the floor: what decoding,
storing and watching a ~650 KB object costs), in the same run, one after the other.

The API server evaluates every CEL rule of a CRD over the whole object on every write, status writes included,
so a rule per tool call, or a comparison of 10,000 calls with the stored ones, is paid on every status patch
(docs/kubernetes.md, "Admission rules"). ``--compare FILE`` adds another Workflow CRD, e.g. an older one:
``git show d5d36bd:crds/workflows.durable-sandbox.dev.yaml > before.yaml`` (the rules per tool call).

    python benchmarks/crd_write_cost.py [--calls 10000] [--patches 5] [--compare before.yaml]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from _common import RESULTS_DIR, fmt, machine_info, print_table, ratio, write_results
from durable_sandbox.kube.api.resources import GROUP, VERSION, WORKFLOWS
from operator_throughput import ROOT, control_plane, kubectl

CRD = ROOT / "crds" / "workflows.durable-sandbox.dev.yaml"


def without_cel(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_cel(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [without_cel(v) for v in node]
    return node


def big(name: str, calls: int) -> dict[str, Any]:
    # The same shape as tests/e2e/test_operator_scale.py's manifest.
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workflow", "metadata": {"name": name},
        "spec": {
            "sandbox": {"provider": "local"}, "snapshotEveryNCalls": max(calls // 4, 1),
            "toolCalls": [{"type": "write_file", "path": f"out/{i % 50}.txt", "contents": f"call {i}: " + "x" * 40}
                          for i in range(calls)],
        },
    }  # fmt: skip


def timed(action: Callable[[], object]) -> float | None:
    """Seconds the request took, or None when the API server refused it (e.g. a 504 after its 60 s timeout)."""
    started = time.monotonic()
    try:
        action()
    except Exception as exc:
        print(f"  failed after {time.monotonic() - started:.1f}s: {str(exc).splitlines()[0]}", file=sys.stderr)
        return None
    return time.monotonic() - started


def median(samples: list[float | None]) -> float | None:
    done = [s for s in samples if s is not None]
    return statistics.median(done) if len(done) == len(samples) and done else None


def measure(kubeconfig: str, crd: dict[str, Any], label: str, calls: int, patches: int) -> dict[str, Any]:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd))
    kubectl(kubeconfig, "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
    # The policy (the toolCalls comparison on updates of the Workflow itself) is part of what is shipped.
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD.with_name(CRD.stem + ".policy.yaml")))
    api = k8s.CustomObjectsApi(k8s_config.new_client_from_config(kubeconfig))
    name = f"big-{label}-{int(time.time())}".lower().replace(" ", "-")
    ns = "default"
    create = timed(lambda: api.create_namespaced_custom_object(GROUP, VERSION, ns, WORKFLOWS, big(name, calls),
                                                               _request_timeout=300))
    status = [timed(lambda i=i: api.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, WORKFLOWS, name, {"status": {"phase": "Running", "calls": {"completed": i, "total": calls}}},
        _request_timeout=300)) for i in range(patches)]  # fmt: skip
    main = [timed(lambda i=i: api.patch_namespaced_custom_object(
        GROUP, VERSION, ns, WORKFLOWS, name, {"metadata": {"labels": {"bench": str(i)}}}, _request_timeout=300))
        for i in range(patches)]  # fmt: skip
    kubectl(kubeconfig, "delete", "workflow", name, "-n", ns, "--wait=false")
    return {"crd": label, "calls": calls, "create_s": create, "status_patch_s": status, "status_patch_median_s": median(status),
            "main_patch_s": main, "main_patch_median_s": median(main)}  # fmt: skip


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    shipped = yaml.safe_load(CRD.read_text())
    variants = [("shipped", shipped), ("no CEL rules", without_cel(copy.deepcopy(shipped)))]
    for path in args.compare:
        variants.append((Path(path).stem, yaml.safe_load(Path(path).read_text())))
    rows = []
    with control_plane(args.kubeconfig, workdir) as kubeconfig:
        for label, crd in variants:
            rows.append(measure(kubeconfig, crd, label, args.calls, args.patches))
            print(json.dumps(rows[-1]), file=sys.stderr)
    floor = rows[1]["status_patch_median_s"]
    for row in rows:
        row["status_patch_vs_no_cel"] = ratio(row["status_patch_median_s"], floor)
    return {"benchmark": "crd_write_cost", "machine": machine_info(), "results": rows}


def report(res: dict[str, Any]) -> None:
    rows = [[r["crd"], fmt(r["create_s"], " s", 2), fmt(r["status_patch_median_s"], " s", 2),
             fmt(r["status_patch_vs_no_cel"], "x", 2), fmt(r["main_patch_median_s"], " s", 2)] for r in res["results"]]  # fmt: skip
    calls = res["results"][0]["calls"]
    print_table(f"Writes to a {calls}-call Workflow (medians; n/a = a request failed)",
                ["CRD", "create", "status patch", "vs no CEL", "Workflow patch"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--patches", type=int, default=5, help="status patches and Workflow patches, each")
    parser.add_argument("--compare", action="append", default=[], metavar="CRD.yaml", help="another Workflow CRD")
    parser.add_argument("--kubeconfig", help="use this cluster instead of starting a control plane")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "crd_write_cost.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dsb-bench-crd-") as tmp:
        res = run(args, Path(tmp))
    write_results(res, args.out)
    report(res)


if __name__ == "__main__":
    main()
