"""The contract kit against the local provider (temp home, injectable clock: leases expire without sleeping)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider
from durable_sandbox.providers.local import LocalProvider
from durable_sandbox.providers.testing import ProviderContractSuite
from durable_sandbox.testing import FakeClock


class TestLocalContract(ProviderContractSuite):
    oversized_workspace = "truncate -s 2G holes"  # tarfile writes holes out: past the default 1 GiB limit
    @pytest.fixture
    async def provider(self, tmp_path: Path) -> AsyncIterator[SandboxProvider]:
        self.clock = FakeClock(start=1_700_000_000.0)
        provider = LocalProvider(home=tmp_path / "home", clock=self.clock)
        yield provider
        await provider.aclose()

    # lose(): the kit's default uses the provider's own loss injection, which local advertises.

    async def expire_lease(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        self.clock.advance(self.lease_seconds + 1)
