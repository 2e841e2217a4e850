"""The contract kit against the e2b provider talking HTTP to the fake E2B server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from durable_sandbox.providers.contract import SandboxHandle, SandboxProvider
from durable_sandbox.providers.testing import ProviderContractSuite
from tests.contract.e2b_support import make_provider
from tests.fakes.e2b_state import FakeState


class TestE2BContract(ProviderContractSuite):
    @pytest.fixture
    async def provider(self, fake_e2b: FakeState) -> AsyncIterator[SandboxProvider]:
        self.fake = fake_e2b
        provider = make_provider(fake_e2b)
        yield provider
        await provider.aclose()

    async def lose(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        self.fake.kill(handle.id)

    async def expire_lease(self, provider: SandboxProvider, handle: SandboxHandle) -> None:
        self.fake.advance(self.lease_seconds + 1)
