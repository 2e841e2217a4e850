"""Acceptance 3 (and 5 through the image): the operator runs FROM THE IMAGE built from the repository's
Dockerfile, the way the chart's Pod would run it, and reconciles examples/hello-workflow.yaml to Succeeded.

There is no kubelet here, so the test plays its part: the chart is `helm install`ed (namespaced, the local
provider allowed), and the Deployment it made gives the container's args, env and UID. The process runs from
the image with `buildah run --isolation chroot` as that UID, with the image's entrypoint plus the chart's args,
the chart's env (the downward-API fields filled in as the kubelet would), emptyDirs at the chart's mount paths,
and, for credentials, a token of the chart's ServiceAccount from the TokenRequest API written into a
kubeconfig. So everything it does is done with the chart's RBAC: a missing permission would fail the run.
While it runs, /metrics and /healthz on the chart's metrics port are scraped.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import ControlPlane, wait_until
from .image_support import Image, build_image, container, run_args, stop
from .operator_support import free_port, http_get, scrape, total
from .test_chart import CHART, run_helm

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello-workflow.yaml"
RELEASE = "imaged"


def sa_kubeconfig(cp: ControlPlane, namespace: str, sa: str, path: Path) -> None:
    """A kubeconfig holding a TokenRequest token of ``sa`` (what the kubelet mounts into a Pod)."""
    token = cp.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cp.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data") or base64.b64encode(
        Path(cluster["certificate-authority"]).read_bytes()
    ).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "cp", "cluster": {"server": cp.server, "certificate-authority-data": ca}}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "cp", "user": sa, "namespace": namespace}}],
    }))


def pod_env(container_spec: dict[str, Any], pod_name: str, namespace: str) -> dict[str, str]:
    """The container's env as the kubelet resolves it (values and the downward-API fields the chart uses)."""
    env: dict[str, str] = {}
    for item in container_spec.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        field = item["valueFrom"]["fieldRef"]["fieldPath"]
        env[item["name"]] = {"metadata.name": pod_name, "metadata.namespace": namespace}[field]
    return env


@pytest.fixture
def image() -> Image:
    return build_image()


@pytest.fixture
def installed(control_plane: ControlPlane, helm: Path, tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    """The chart, installed namespaced into a fresh namespace; yields (namespace, release namespace, port)."""
    suffix = uuid.uuid4().hex[:6]
    ns, op_ns = f"img-{suffix}", f"img-op-{suffix}"
    control_plane.kubectl("create", "namespace", ns)
    port = free_port()
    home = tmp_path / "helm"
    # Helm skips CRDs that exist (another test may have installed them): make sure they are the current ones.
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    run_helm(helm, home, "install", f"{RELEASE}-{suffix}", str(CHART), "-n", op_ns, "--create-namespace",
             "--set", f"watchNamespaces={{{ns}}}", "--set", "allowLocalProvider=true",
             "--set", f"metrics.port={port}", kubeconfig=control_plane.kubeconfig)
    try:
        yield ns, op_ns, port
    finally:
        run_helm(helm, home, "uninstall", f"{RELEASE}-{suffix}", "-n", op_ns, kubeconfig=control_plane.kubeconfig)
        for name in (ns, op_ns):
            control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def test_operator_from_the_image_reconciles_hello_as_the_charts_service_account(
    control_plane: ControlPlane, image: Image, installed: tuple[str, str, int], tmp_path: Path
) -> None:
    ns, op_ns, port = installed
    [deploy] = control_plane.kubectl_json("get", "deployments", "-n", op_ns)["items"]
    pod = deploy["spec"]["template"]["spec"]
    [spec] = pod["containers"]
    uid, gid = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    assert spec["securityContext"]["runAsNonRoot"] is True and uid != 0
    sa = pod["serviceAccountName"]

    # What the kubelet would mount: a token for the ServiceAccount (here in a kubeconfig), and the emptyDirs.
    secrets = tmp_path / "sa"
    secrets.mkdir()
    sa_kubeconfig(control_plane, op_ns, sa, secrets / "kubeconfig")
    mounts = {secrets: "/etc/durable-sandbox/credentials:ro"}
    for mount in spec["volumeMounts"]:
        host = tmp_path / "volumes" / mount["name"]
        host.mkdir(parents=True)
        os.chown(host, uid, gid)
        mounts[host] = mount["mountPath"]
    os.chmod(secrets / "kubeconfig", 0o644)
    env = {**pod_env(spec, f"{deploy['metadata']['name']}-0", op_ns), "KUBECONFIG": "/etc/durable-sandbox/credentials/kubeconfig"}
    argv = [*image.config()["Entrypoint"], *spec["args"]]
    assert f"--namespace={ns}" in argv and "--allow-local-provider" in argv and f"--metrics-port={port}" in argv

    log = (tmp_path / "operator.log").open("wb")
    with container(image) as ctr:
        process = subprocess.Popen(
            run_args(ctr, argv, user=f"{uid}:{gid}", env=env, mounts=mounts),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            try:
                wait_until(lambda: http_get(port, "/healthz")[0] == 200 or process.poll() is not None, 120,
                           "the operator's /healthz")
                assert process.poll() is None, "the operator exited"
                control_plane.kubectl("apply", "-n", ns, "-f", str(HELLO))
                control_plane.kubectl("wait", "--for=condition=Succeeded", "workflow/hello", "-n", ns,
                                      "--timeout=180s")
            except (AssertionError, TimeoutError) as exc:
                raise AssertionError(f"{exc}\n--- operator log:\n{(tmp_path / 'operator.log').read_text()[-6000:]}") from exc
            status = control_plane.kubectl_json("get", "workflow", "hello", "-n", ns)["status"]
            assert status["phase"] == "Succeeded" and status["calls"] == {"completed": 4, "total": 4}
            assert [r["exitCode"] for r in status["result"]["toolResults"]] == [0, 0, 0, 2]

            got = scrape(port)
            assert total(got, "durable_sandbox_tool_calls_total", provider="local") == 4
            assert total(got, "durable_sandbox_snapshots_total", provider="local") == 2
            writes = sum(v for (n, labels), v in got.items() if n == "durable_sandbox_kube_api_requests_total"
                         and dict(labels)["verb"] in ("create", "patch", "update") and dict(labels)["code"].startswith("2"))
            assert writes > 0
            denied = [dict(labels) for (n, labels), v in got.items()
                      if n == "durable_sandbox_kube_api_requests_total" and dict(labels)["code"] == "403" and v]
            assert denied == [], f"the chart's RBAC refused requests the operator made: {denied}"
        finally:
            stop(process)
            log.close()
    # The operator wrote only into the chart's writable mounts, as its own UID.
    state = tmp_path / "volumes" / "state"
    assert all(p.stat().st_uid == uid for p in state.rglob("*")), "files not owned by the chart's UID"
    shutil.rmtree(tmp_path / "volumes", ignore_errors=True)
