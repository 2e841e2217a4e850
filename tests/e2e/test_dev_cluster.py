"""scripts/dev-cluster with its node, as a person uses it (issue 22, acceptance 1 and 3): `up` gives a Ready
node on which a Pod from a locally built image runs and kubectl logs, exec, exec -i and cp work; `down` leaves
nothing on the machine (no process, mount, link, route, cgroup, path, sysctl or iptables rule of the node's);
and a node that cannot start fails `up` with one error naming what is missing, having started nothing.

These start the machine's one node themselves, so they run before the session's ``node_cluster`` takes it
(marker ``own_node``), and check the machine while holding the node lock: no other node can start meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .controlplane import PROJECT_ROOT, build_controlplane, kubectl_path, wait_until
from .node_support import (
    BUSYBOX,
    LOCK_TIMEOUT_S,
    build_test_image,
    busybox_context,
    host_state,
    node_lock,
    prepare_node,
)

pytestmark = [pytest.mark.own_node, pytest.mark.timeout(LOCK_TIMEOUT_S + 600)]

DEV_CLUSTER = PROJECT_ROOT / "scripts" / "dev-cluster"


def dev_cluster(*args: str, env: dict[str, str], timeout: float = LOCK_TIMEOUT_S + 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DEV_CLUSTER), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # A directory of the test's own (a developer's .dev-cluster is left alone); wait for a node of another
    # session instead of failing at once.
    return {**os.environ, "DEV_CLUSTER_DIR": str(tmp_path / "dev-cluster"),
            "DEV_CLUSTER_NODE_LOCK_TIMEOUT": f"{LOCK_TIMEOUT_S:.0f}s",
            "DEV_CLUSTER_READY_TIMEOUT": f"{LOCK_TIMEOUT_S + 300:.0f}"}


def test_up_runs_pods_and_down_leaves_nothing_behind(env: dict[str, str], tmp_path: Path) -> None:
    build_controlplane()
    prepare_node()
    # Under the node lock: another session's node changes the machine (sysctls, links) while it runs, and a
    # "before" taken then would count its own restore as something this cluster left behind.
    with node_lock():
        before = host_state()
    up = dev_cluster("up", env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert "[3/3] starting the control plane and node dsb-node" in up.stderr
        kubeconfig = Path(env["DEV_CLUSTER_DIR"]) / "kubeconfig"
        assert f"export KUBECONFIG={kubeconfig}" in up.stdout.splitlines()
        k = Kubectl(kubeconfig)
        k("wait", "--for=condition=Ready", "node/dsb-node", "--timeout=60s")

        _, tag = build_test_image(busybox_context(), BUSYBOX)
        loaded = dev_cluster("load-image", tag, env=env)
        assert loaded.returncode == 0, loaded.stderr
        k.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "try"}, "spec": {
            "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": tag, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo hello from dev-cluster; exec sleep 3600"]}]}})
        k("wait", "--for=condition=Ready", "pod/try", "--timeout=120s")
        wait_until(lambda: "hello from dev-cluster" in k("logs", "try").stdout, 30, "the Pod's log")
        assert k("exec", "try", "--", "echo", "exec works").stdout == "exec works\n"
        assert k("exec", "-i", "try", "--", "cat", input="exec -i works\n").stdout == "exec -i works\n"
        (tmp_path / "f").write_text("cp works\n")
        k("cp", str(tmp_path / "f"), "default/try:/tmp/f")
        k("cp", "default/try:/tmp/f", str(tmp_path / "back"))
        assert (tmp_path / "back").read_text() == "cp works\n"
    finally:
        down = dev_cluster("down", env=env, timeout=300)
    assert down.returncode == 0, down.stderr
    with node_lock():
        left = host_state().left_by_node(before)
    assert left == {}, f"scripts/dev-cluster down left this behind: {left}"


class Kubectl:
    """The real kubectl against the dev cluster's kubeconfig, as the person who ran `up` would use it."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.bin = kubectl_path()

    def __call__(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.bin, f"--kubeconfig={self.kubeconfig}", *args], input=input, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc

    def apply(self, manifest: dict[str, Any]) -> None:
        self("apply", "-f", "-", input=json.dumps(manifest))


def path_without(tmp_path: Path, *missing: str) -> str:
    """A PATH that has every program of this machine except ``missing``, and an apt-get that cannot install
    anything (as on a machine whose package mirror is unreachable)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for d in [*os.environ["PATH"].split(os.pathsep), "/usr/local/go/bin", "/usr/sbin", "/sbin"]:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = fake / name
            if name not in missing and not target.exists() and os.access(os.path.join(d, name), os.X_OK):
                target.symlink_to(os.path.join(d, name))
    apt = fake / "apt-get"
    apt.unlink(missing_ok=True)
    apt.write_text("#!/bin/sh\necho 'E: Unable to locate package containerd' >&2\nexit 100\n")
    apt.chmod(0o755)
    return str(fake)


def test_up_fails_with_one_clear_error_when_containerd_cannot_be_installed(env: dict[str, str], tmp_path: Path) -> None:
    build_controlplane()
    env = {**env, "PATH": path_without(tmp_path, "containerd", "containerd-shim-runc-v2", "ctr"),
           "DURABLE_SANDBOX_NODE_CACHE": str(tmp_path / "node-cache")}
    before = host_state()
    up = dev_cluster("up", env=env)
    assert up.returncode == 1, up.stdout + up.stderr
    errors = [line for line in up.stderr.splitlines() if "cannot" in line]
    assert errors[0].startswith("node-prepare: cannot install containerd") and "apt-get failed" in errors[0], up.stderr
    assert "dev-cluster: the node cannot start: scripts/node-prepare failed (above); nothing was started" in up.stderr
    assert not (Path(env["DEV_CLUSTER_DIR"]) / "up.pid").exists()
    with node_lock():
        assert host_state().left_by_node(before) == {}


def test_up_names_a_missing_program_before_starting_anything(tmp_path: Path) -> None:
    binary = build_controlplane()
    workdir = tmp_path / "cp"
    workdir.mkdir()
    env = {**os.environ, "PATH": path_without(tmp_path, "socat")}
    proc = subprocess.run([str(binary), "up", "--dir", str(workdir), "--ready-file", str(workdir / "ready"),
                           "--node", "dsb-node"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "controlplane up: node: socat is not installed (not on PATH); scripts/node-prepare installs it"]
    assert not (workdir / "etcd").exists(), "nothing started"


def test_a_node_failing_half_way_undoes_what_it_started(tmp_path: Path) -> None:
    """containerd running, the bridges made, then the sandbox image is missing: `up` stops and removes it all."""
    binary = build_controlplane()
    prepare_node()
    key, tag = build_test_image(busybox_context(), BUSYBOX)
    from .node_support import _archive

    not_pause = _archive(key, tag, BUSYBOX)
    workdir = tmp_path / "cp"
    workdir.mkdir()
    with node_lock() as fd:
        before = host_state()
        proc = subprocess.run([str(binary), "up", "--dir", str(workdir), "--ready-file", str(workdir / "ready"),
                               "--node", "dsb-node", "--node-image", str(not_pause), "--node-lock-fd", str(fd)],
                              capture_output=True, text=True, timeout=300, pass_fds=(fd,), check=False)
        assert proc.returncode == 1
        assert "node: the sandbox image localhost/pause:3.10 is not among the imported images" in proc.stderr
        assert "node: starting containerd" in proc.stderr, "it failed after containerd and the bridges were up"
        assert host_state().left_by_node(before) == {}
