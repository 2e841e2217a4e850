"""The kits users need to test their own code against durable-sandbox, in one place (docs/testing.md, "The kits").

- ``StoreContractSuite`` (and ``DamagedRowCases``): the store protocol's rules as a pytest suite for any store.
- ``ProviderContractSuite`` (and ``ContractResources``): contract v1's rules as a pytest suite for any provider.
- ``FakeClock``: the engine's wall clock, moved by the test (``clock.install(monkeypatch)``, then ``advance``).
- ``SteppedClock``: a lease keeper's clock that moves only when slept on (renewal deadlines without waiting).

The names resolve lazily, so a provider's tests that import ``ProviderContractSuite`` load no engine module.
The kits need pytest (and pytest-asyncio). The old paths (``durable_sandbox.stores.testing``,
``durable_sandbox.providers.testing``) keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from durable_sandbox.lazy_names import lazy_names

if TYPE_CHECKING:
    from durable_sandbox.providers.testing import ContractResources, ProviderContractSuite
    from durable_sandbox.stores.testing import DamagedRowCases, StoreContractSuite
    from durable_sandbox.testing.clock import FakeClock, SteppedClock

_ORIGIN: Final[Mapping[str, str]] = {
    "ContractResources": "durable_sandbox.providers.testing",
    "DamagedRowCases": "durable_sandbox.stores.testing",
    "FakeClock": "durable_sandbox.testing.clock",
    "ProviderContractSuite": "durable_sandbox.providers.testing",
    "SteppedClock": "durable_sandbox.testing.clock",
    "StoreContractSuite": "durable_sandbox.stores.testing",
}

__all__ = ["ContractResources", "DamagedRowCases", "FakeClock", "ProviderContractSuite", "SteppedClock",
           "StoreContractSuite"]

__getattr__, __dir__ = lazy_names(__name__, globals(), _ORIGIN)
