"""Fixtures of the contract tier: the fake E2B server, and an e2b provider wired to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from durable_sandbox.providers.e2b import E2BProvider
from tests.contract.e2b_support import make_provider
from tests.fakes.fixtures import FakeState, fake_e2b

__all__ = ["e2b", "fake_e2b"]


@pytest.fixture
async def e2b(fake_e2b: FakeState) -> AsyncIterator[E2BProvider]:
    """The e2b provider talking to ``fake_e2b`` (test modules may override it)."""
    provider = make_provider(fake_e2b)
    yield provider
    await provider.aclose()
