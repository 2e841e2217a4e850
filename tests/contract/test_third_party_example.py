"""The example third-party provider (examples/third-party-provider) passes the contract kit, and its
entry-point declaration registers it with durable-sandbox."""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_sandbox.providers import registry
from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider
from durable_sandbox.providers.testing import ProviderContractSuite
from durable_sandbox.testing import FakeClock

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third-party-provider"
if str(EXAMPLE / "src") not in sys.path:  # importable without installing; CI also pip-installs it
    sys.path.insert(0, str(EXAMPLE / "src"))

from dsb_dirsnap import DirSnapProvider  # noqa: E402


class TestDirSnapContract(ProviderContractSuite):
    @pytest.fixture
    async def provider(self, tmp_path: Path) -> AsyncIterator[SandboxProvider]:
        self.clock = FakeClock(start=1_700_000_000.0)
        provider = DirSnapProvider(root=tmp_path / "dirsnap", clock=self.clock)
        yield provider
        await provider.aclose()

    async def lose(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        assert isinstance(provider, DirSnapProvider)
        shutil.rmtree(provider.workspace(handle.id))  # gone behind the provider's back

    async def expire_lease(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        self.clock.advance(self.lease_seconds + 1)


def test_declared_entry_point_registers_the_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install-free: publish the example's declared entry points as distribution metadata on sys.path,
    exactly what pip would write, and check the registry finds the provider through them."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][registry.ENTRY_POINT_GROUP]
    assert declared == {"dirsnap": "dsb_dirsnap:DirSnapProvider"}
    dist_info = tmp_path / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = [f"[{registry.ENTRY_POINT_GROUP}]", *(f"{k} = {v}" for k, v in declared.items())]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert registry.available_providers()["dirsnap"] is DirSnapProvider
    provider = registry.create_provider("dirsnap", root=tmp_path / "root")
    assert isinstance(provider, DirSnapProvider) and provider.name == "dirsnap"


def test_installed_distribution_registers_the_provider() -> None:
    try:
        dist = importlib.metadata.distribution("dsb-dirsnap")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("dsb-dirsnap is not installed (CI runs: pip install -e examples/third-party-provider)")
    assert [(ep.name, ep.value) for ep in dist.entry_points if ep.group == registry.ENTRY_POINT_GROUP] == [
        ("dirsnap", "dsb_dirsnap:DirSnapProvider")
    ]
    assert registry.available_providers()["dirsnap"].__name__ == "DirSnapProvider"
