"""`KubeClient.connect` with a kubeconfig that is not there: one clear error, as docs/cli.md promises for
every error (`error: ` lines on stderr), not the Kubernetes client's bare "Config not found" log line
followed by a misleading "Expected key current-context"."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from durable_sandbox.kube.api.client import KubeClient
from tests.dsb import dsb

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


async def test_a_missing_kubeconfig_is_one_clear_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = tmp_path / "nope" / "kubeconfig"
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError) as raised:
        await KubeClient.connect(kubeconfig=str(missing))
    assert f"from {missing}: no such kubeconfig file" in str(raised.value)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("kubernetes")] == []


async def test_a_kubeconfig_list_with_one_existing_file_still_loads(tmp_path: Path) -> None:
    real = tmp_path / "kubeconfig"
    real.write_text(KUBECONFIG)
    client = await KubeClient.connect(kubeconfig=os.pathsep.join([str(tmp_path / "missing"), str(real)]))
    try:
        assert client.api_client.configuration.host == "https://127.0.0.1:6443"
    finally:
        await client.close()


def test_dsb_kube_with_a_missing_kubeconfig_prints_only_error_lines(tmp_path: Path) -> None:
    done = dsb("--kube", "runs", env={"KUBECONFIG": str(tmp_path / "missing")}, process=True)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), done.stderr
    assert "no such kubeconfig file" in done.stderr
