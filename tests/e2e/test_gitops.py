"""Acceptance 6: GitOps. The Workflow kept in Git (examples/gitops/workflows) is applied the way Argo CD and
Flux apply (server-side apply under their field manager), run to completion by the operator, then re-applied
unchanged: no conflict, no change to spec, and `kubectl diff --server-side` of the Git copy is empty. The
operator's field manager owns only status and its finalizer.

Argo CD and Flux themselves do not run here (no container engine); their manifests in examples/gitops are
checked to be well-formed and to point at what exists in this repository."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import install_crds, namespace, operators, wait_condition

__all__ = ["namespace", "operators"]  # fixtures

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "examples" / "gitops"
WORKFLOW = GITOPS / "workflows" / "hello-gitops.yaml"
MANAGER = "argocd-controller"


def apply_from_git(cp: ControlPlane, ns: str) -> Any:
    return cp.kubectl("apply", "--server-side", f"--field-manager={MANAGER}", "-n", ns, "-f", str(WORKFLOW),
                      check=False)


def managers(obj: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for entry in obj["metadata"].get("managedFields", []):
        out.setdefault(entry["manager"], []).append(entry)
    return out


def test_git_copy_reapplies_cleanly_after_the_operator_ran_it(
    control_plane: ControlPlane, namespace: str, operators: Any
) -> None:
    operators("--allow-local-provider")
    first = apply_from_git(control_plane, namespace)
    assert first.returncode == 0, first.stderr
    wait_condition(control_plane, namespace, "hello-gitops", "Succeeded", timeout=120)
    before = control_plane.kubectl_json("get", "workflow", "hello-gitops", "-n", namespace)
    assert before["status"]["phase"] == "Succeeded"
    assert before["metadata"]["finalizers"] == ["durable-sandbox.dev/cleanup"]

    again = apply_from_git(control_plane, namespace)
    assert again.returncode == 0 and "conflict" not in (again.stdout + again.stderr).lower(), again.stderr
    after = control_plane.kubectl_json("get", "workflow", "hello-gitops", "-n", namespace, "--show-managed-fields")
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["status"]["phase"] == "Succeeded", "re-applying Git did not restart or disturb the run"

    diff = control_plane.kubectl("diff", "--server-side", f"--field-manager={MANAGER}", "-n", namespace,
                                 "-f", str(WORKFLOW), check=False)
    assert diff.returncode == 0 and diff.stdout == "", diff.stdout + diff.stderr

    # Who owns what: Git's manager owns the spec; every other manager only status and the finalizer.
    owned = managers(after)
    assert "f:spec" in json.dumps(owned[MANAGER])
    for manager, entries in owned.items():
        if manager == MANAGER:
            continue
        for entry in entries:
            fields = entry.get("fieldsV1", {})
            if entry.get("subresource") == "status":
                assert set(fields) <= {"f:status"}, (manager, fields)
            else:
                assert set(fields) <= {"f:metadata"}, (manager, fields)
                assert set(fields.get("f:metadata", {})) <= {"f:finalizers"}, (manager, fields)


def test_gitops_examples_are_well_formed(control_plane: ControlPlane) -> None:
    docs = {p.relative_to(GITOPS).as_posix(): list(yaml.safe_load_all(p.read_text())) for p in GITOPS.rglob("*.yaml")}
    kinds = {path: [d["kind"] for d in ds if d] for path, ds in docs.items()}
    assert kinds["argocd/operator.yaml"] == ["Application"]
    assert kinds["argocd/workflows.yaml"] == ["Application"]
    assert kinds["flux/operator-helmrelease.yaml"] == ["HelmRelease"]
    assert kinds["flux/workflows-kustomization.yaml"] == ["Kustomization"]
    # The paths they name exist in this repository.
    assert docs["argocd/operator.yaml"][0]["spec"]["source"]["path"] == "charts/durable-sandbox"
    assert (ROOT / docs["argocd/workflows.yaml"][0]["spec"]["source"]["path"]).is_dir()
    assert (ROOT / docs["flux/operator-helmrelease.yaml"][0]["spec"]["chart"]["spec"]["chart"]).is_dir()
    assert (ROOT / docs["flux/workflows-kustomization.yaml"][0]["spec"]["path"]).is_dir()
    # The Workflows folder is a valid kustomization whose Workflow the API server accepts.
    rendered = control_plane.kubectl("kustomize", str(GITOPS / "workflows")).stdout
    [workflow] = [d for d in yaml.safe_load_all(rendered) if d]
    assert workflow["kind"] == "Workflow" and workflow["metadata"]["namespace"] == "workflows"
    install_crds(control_plane)
    control_plane.kubectl("apply", "--server-side", "--dry-run=server", "-n", "default", "-f", str(WORKFLOW))
