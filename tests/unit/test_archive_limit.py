"""Issue 32, item 4: a snapshot's archive is bounded (providers/archive_limit.py), so a sparse file made in a sandbox
(`truncate -s 2G`) cannot make every snapshot upload 2 GiB, nor a restore write it onto the disk. The local provider
here; the kubernetes provider on the test node (tests/e2e/test_kubernetes_provider_node.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from durable_sandbox.providers.archive_limit import (
    ArchiveBudget,
    ArchiveTooLarge,
    configured_limit,
    quantity_bytes,
)
from durable_sandbox.providers.contract import ConfigurationError, SandboxHandle, SandboxSpec
from durable_sandbox.providers.kubernetes import KubernetesProvider
from durable_sandbox.providers.kubernetes_template import PodTemplate
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.providers.s3_snapshots import S3SnapshotStore, SnapshotName
from tests.unit.sandbox_session_support import engine_for

MiB = 2**20


def test_the_budget_stops_at_the_limit_and_says_which() -> None:
    budget = ArchiveBudget(10 * MiB, "snapshot of ns/dsb-1", "DSB_K8S_SNAPSHOT_LIMIT")
    budget.spend(10 * MiB)  # exactly the limit is fine
    with pytest.raises(ArchiveTooLarge) as caught:
        budget.spend(1)
    text = str(caught.value)
    assert caught.value.retryable is False and caught.value.limit == 10 * MiB
    assert text.startswith("snapshot of ns/dsb-1: ") and "10 MiB" in text and "DSB_K8S_SNAPSHOT_LIMIT" in text
    assert "sparse" in text, "it says what to do"


def test_limits_are_kubernetes_quantities() -> None:
    assert quantity_bytes("1Gi", "x") == 2**30 and quantity_bytes("500M", "x") == 500 * 10**6
    assert quantity_bytes("1048576", "x") == MiB and quantity_bytes("1.5Ki", "x") == 1536
    for bad in ("", "0", "-1Gi", "1GB", "lots"):
        with pytest.raises(ConfigurationError, match="SETTING must be a positive size"):
            quantity_bytes(bad, "SETTING")
    assert configured_limit({}, "K", "2Gi", "the workspace's sizeLimit") == 2 * 2**30
    assert configured_limit({"K": "3Mi"}, "K", "2Gi", "the workspace's sizeLimit") == 3 * MiB


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as f:
        f.truncate(size)


async def test_a_sparse_file_fails_the_local_snapshot_clearly_and_writes_nothing(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home", snapshot_limit=4 * MiB)
    handle = await provider.provision(SandboxSpec(owner="run-1"), lease_seconds=600)
    workspace = provider.workspace_path(handle.id)
    (workspace / "small.txt").write_text("kept")
    _sparse(workspace / "holes", 2 * 2**30)  # 2 GiB apparent, nothing on disk
    with pytest.raises(ArchiveTooLarge, match=r"snapshot of .*: the workspace's archive is larger than the limit "
                                              r"of 4 MiB \(DSB_LOCAL_SNAPSHOT_LIMIT"):
        await provider.snapshot(handle, operation_id="op-1")
    assert list(provider.snapshots_dir.iterdir()) == [], "no snapshot, no temp file"
    # The sandbox and the provider go on: without the file the next snapshot is taken and restores.
    (workspace / "holes").unlink()
    snapshot = await provider.snapshot(handle, operation_id="op-2")
    restored = await provider.restore(snapshot, SandboxSpec(owner="run-1"), lease_seconds=600)
    assert (provider.workspace_path(restored.id) / "small.txt").read_text() == "kept"


async def test_a_restore_never_writes_an_archive_past_the_limit(tmp_path: Path) -> None:
    taking = LocalProvider(tmp_path / "home", snapshot_limit=64 * MiB)
    handle = await taking.provision(SandboxSpec(owner="run-1"), lease_seconds=600)
    (taking.workspace_path(handle.id) / "big").write_bytes(os.urandom(8 * MiB))
    snapshot = await taking.snapshot(handle, operation_id="op-1")
    before = set(os.listdir(taking.workspaces_dir))
    restoring = LocalProvider(tmp_path / "home", snapshot_limit=4 * MiB)
    with pytest.raises(ArchiveTooLarge, match=f"restore of snapshot {snapshot}: .* 4 MiB"):
        await restoring.restore(snapshot, SandboxSpec(owner="run-1"), lease_seconds=600)
    assert set(os.listdir(taking.workspaces_dir)) == before, "nothing was extracted"


def test_the_local_limit_is_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert LocalProvider(tmp_path / "a").snapshot_limit == 2**30
    monkeypatch.setenv("DSB_LOCAL_SNAPSHOT_LIMIT", "2Gi")
    assert LocalProvider(tmp_path / "b").snapshot_limit == 2 * 2**30
    monkeypatch.setenv("DSB_LOCAL_SNAPSHOT_LIMIT", "huge")
    with pytest.raises(ConfigurationError, match="DSB_LOCAL_SNAPSHOT_LIMIT"):
        LocalProvider(tmp_path / "c")


class CountingLocal(LocalProvider):
    def __init__(self, home: Path, **kwargs: Any) -> None:
        super().__init__(home, **kwargs)
        self.snapshots_tried = 0

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        self.snapshots_tried += 1
        return await super().snapshot(handle, operation_id=operation_id)


async def test_a_run_whose_snapshot_is_over_the_limit_fails_saying_so_without_retrying(tmp_path: Path) -> None:
    provider = CountingLocal(tmp_path / "home", snapshot_limit=4 * MiB)
    engine = engine_for(tmp_path / "runs.db", {"local": provider})
    try:
        calls = [{"type": "shell", "command": "truncate -s 2G holes"}, {"type": "shell", "command": "echo next"}]
        state = await engine.run("sandbox-agent", {"toolCalls": calls, "snapshotEveryNCalls": 1}, run_id="sparse")
    finally:
        await engine.aclose()
    assert state.status == "failed"
    assert state.error["type"] == "ArchiveTooLarge"
    assert "larger than the limit of 4 MiB" in state.error["message"]
    assert provider.snapshots_tried == 1, "the same archive again would be as large: not retried"
    assert provider.leftovers() == [], "the failed run left nothing behind"


# --------------------------------------------------------------------------- the kubernetes provider's stream


class StreamingStore:
    """What the provider's snapshot and restore use of the S3 store: ``put`` reads the archive as the real one does
    (and aborts on a failed stream: nothing is stored), ``open`` hands back an object of a given size."""

    def __init__(self, stored_size: int = 0) -> None:
        self.received = 0
        self.stored: list[str] = []
        self.stored_size = stored_size
        self.opened_and_closed = False

    async def exists(self, name: SnapshotName) -> bool:
        return False

    async def put(self, name: SnapshotName, chunks: AsyncIterator[bytes], *, metadata: Any = None) -> bool:
        async for chunk in chunks:
            self.received += len(chunk)
        self.stored.append(name.id)
        return True

    async def open(self, name: SnapshotName) -> tuple[int, AsyncGenerator[bytes, None]]:
        async def data() -> AsyncGenerator[bytes, None]:
            try:
                yield b"x" * self.stored_size
            finally:
                self.opened_and_closed = True

        return self.stored_size, data()


def kubernetes_provider(store: StreamingStore, limit: int) -> KubernetesProvider:
    return KubernetesProvider(namespace="ns", environ={}, store=cast(S3SnapshotStore, store), snapshot_limit=limit)


async def test_a_kubernetes_snapshot_stops_reading_the_pod_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exec's tar output (here: 64 MiB of a file of holes, as busybox's tar writes it) goes to the store only up
    to the limit; then the upload fails and the exec is cancelled, not read to its end."""
    store = StreamingStore()
    provider = kubernetes_provider(store, limit=4 * MiB)
    produced = 0
    finished = False

    async def tar_of_holes(handle: SandboxHandle, script: bytes, *, stdout: Any = None, **_: Any) -> int:
        nonlocal produced, finished
        for _ in range(64 * 4):
            await stdout(b"\0" * (256 * 1024))
            produced += 256 * 1024
        finished = True
        return 0

    async def live(handle: SandboxHandle) -> None:
        return None

    monkeypatch.setattr(provider, "_run", tar_of_holes)
    monkeypatch.setattr(provider, "_require_live", live)
    handle = SandboxHandle(id="ns/dsb-1", provider="kubernetes")
    with pytest.raises(ArchiveTooLarge, match=r"snapshot of ns/dsb-1: .* 4 MiB .*providers\.kubernetes\.snapshots"):
        await provider.snapshot(handle, operation_id="op-1")
    assert store.received <= 4 * MiB and store.stored == [], "nothing past the limit reached the store"
    assert not finished and produced < 8 * MiB, "the exec was cancelled, not read to its end"


async def test_a_kubernetes_restore_over_the_limit_makes_no_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    store = StreamingStore(stored_size=5 * MiB)
    provider = kubernetes_provider(store, limit=4 * MiB)
    provisioned: list[SandboxSpec] = []

    async def provision(spec: SandboxSpec, lease_seconds: int, **_: Any) -> SandboxHandle:
        provisioned.append(spec)
        raise AssertionError("no Pod may be made for an archive over the limit")

    monkeypatch.setattr(provider, "_provision", provision)
    snapshot = SnapshotName.for_operation("op-1", installation=None, owner=None, retained=False).id
    with pytest.raises(ArchiveTooLarge, match=f"restore of snapshot {snapshot}: .* 4 MiB"):
        await provider.restore(snapshot, SandboxSpec(owner="ns/uid"), lease_seconds=60)
    assert provisioned == []


def test_the_kubernetes_limit_defaults_to_the_workspace_size() -> None:
    assert KubernetesProvider(namespace="ns", environ={}).snapshot_limit == 2**30  # the default 1Gi emptyDir
    sized = PodTemplate.model_validate({"workspace": {"sizeLimit": "3Gi"}})
    assert KubernetesProvider(namespace="ns", environ={}, template=sized).snapshot_limit == 3 * 2**30
    assert KubernetesProvider(namespace="ns", environ={"DSB_K8S_SNAPSHOT_LIMIT": "100Mi"}).snapshot_limit == 100 * MiB
    assert KubernetesProvider.configuration_problems({"DSB_K8S_SNAPSHOT_LIMIT": "big"}) == [
        "DSB_K8S_SNAPSHOT_LIMIT must be a positive size such as 1Gi or 500Mi, got 'big'"]
