"""A provider the operator makes for one job outside any run (a cleanup by owner tag, a finished run's leftovers) is
closed after it: left open, its HTTP pools were collected with asyncio's "Unclosed client session" ERROR in the
operator's log (tests/e2e/test_trust_boundary.py's tampered journal, whose cleanup asks every usable provider)."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sandbox.kube.workflow.engines import Engines
from durable_sandbox.kube.workflow.settings import OperatorPolicy


class Closing:
    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


def engines(providers: Any = None) -> Engines:
    made = Engines.__new__(Engines)  # only what provider() reads
    made.policy, made._providers = OperatorPolicy(allow_local_provider=True), providers
    return made


async def test_a_provider_made_for_one_job_is_closed_after_it_even_when_the_job_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Closing] = []
    monkeypatch.setattr("durable_sandbox.providers.registry.create_provider",
                        lambda name: made.append(Closing()) or made[-1])
    async with engines().provider_for_once("local") as provider:
        assert provider is made[0] and provider.closed == 0
    with pytest.raises(RuntimeError):
        async with engines().provider_for_once("local"):
            raise RuntimeError("the provider refused")
    # `dsb operator` gives a factory (each provider instrumented for metrics): what it makes is closed too.
    async with engines(lambda name: made.append(Closing()) or made[-1]).provider_for_once("local") as provider:
        assert provider is made[2]
    assert [p.closed for p in made] == [1, 1, 1]


async def test_a_provider_of_a_fixed_mapping_is_not_closed_by_it() -> None:
    given = Closing()
    async with engines({"local": given}).provider_for_once("local") as provider:
        assert provider is given
    assert given.closed == 0
