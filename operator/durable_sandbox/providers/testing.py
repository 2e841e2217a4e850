"""Provider contract kit: a reusable pytest suite proving that a provider honours contract v1.

Usage (any provider, ours or a third party's)::

    import pytest
    from durable_sandbox.providers.testing import ProviderContractSuite

    class TestMyProviderContract(ProviderContractSuite):
        @pytest.fixture
        async def provider(self, tmp_path):
            p = MyProvider(root=tmp_path)
            yield p
            await p.aclose()

        async def lose(self, provider, handle):       # make the sandbox vanish behind the provider's back
            ...
        async def expire_lease(self, provider, handle):  # make the sandbox's lease run out (no sleeping)
            ...

pytest collects every ``test_*`` method of the subclass. Tests of capabilities the provider does not
advertise check that the calls raise :class:`UnsupportedCapability` before acting; tests that need a hook the
subclass did not supply are skipped with a message naming the hook. Requires pytest-asyncio (auto mode or
``asyncio`` markers applied by the subclass).
"""

from __future__ import annotations

from durable_sandbox.providers.kit_base import ContractResources, ProviderKit
from durable_sandbox.providers.kit_declarations import DeclarationCases
from durable_sandbox.providers.kit_lifecycle import LifecycleCases
from durable_sandbox.providers.kit_reconciliation import ReconciliationCases
from durable_sandbox.providers.kit_snapshots import SnapshotCases
from durable_sandbox.providers.kit_tools import ToolCases

__all__ = ["ContractResources", "DeclarationCases", "LifecycleCases", "ProviderContractSuite", "ProviderKit",
           "ReconciliationCases", "SnapshotCases", "ToolCases"]


# pytest runs a class's inherited tests base first (the reverse of the MRO): listed last to first, the groups run
# in the order they are read here (declarations, tool types, lifecycle, snapshots, reconciliation and loss).
class ProviderContractSuite(ReconciliationCases, SnapshotCases, LifecycleCases, ToolCases, DeclarationCases):
    """Subclass as ``Test<Something>`` and override :meth:`provider` (and the hooks you can supply). Each group of
    cases is also a class of its own (``ToolCases``, ``SnapshotCases``, ...)."""
