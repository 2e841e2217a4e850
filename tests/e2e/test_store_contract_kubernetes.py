"""The store contract kit (stores/testing.py) against KubernetesStore on the real control plane: each test
in a namespace of its own, a peer instance with its own connection (another replica's view), lease expiry
through the stores' injectable monotonic clock (no sleeping), and every value sealed (as the operator's are)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from durable_sandbox.engine.records import Lease
from durable_sandbox.engine.store import Store
from durable_sandbox.kube.store import KubernetesStore
from durable_sandbox.stores.testing import StoreContractSuite
from tests.e2e.controlplane import ControlPlane
from tests.e2e.store_support import TEST_JOURNAL_KEY, ManualMonotonic, drop_namespace, namespace_with_crds

pytestmark = pytest.mark.apiserver_journal("KubernetesStore itself; PostgresStore's own: tests/postgres")


class TestKubernetesStoreContract(StoreContractSuite):
    @pytest.fixture
    async def store(self, control_plane: ControlPlane) -> AsyncIterator[Store]:
        self.clock = ManualMonotonic()
        self.namespace = namespace_with_crds(control_plane, "store-kit")
        s = await KubernetesStore.connect(self.namespace, clock=self.clock, journal_key=TEST_JOURNAL_KEY)
        yield s
        await s.close()
        drop_namespace(control_plane, self.namespace)

    @pytest.fixture
    async def peer(self, store: Store) -> AsyncIterator[Store]:
        s = await KubernetesStore.connect(self.namespace, clock=self.clock, journal_key=TEST_JOURNAL_KEY)
        yield s
        await s.close()

    async def expire_lease(self, store: Store, lease: Lease) -> None:
        # Expiry is "the Lease did not change for leaseDurationSeconds by our monotonic clock"; every store
        # here shares this clock and has seen the lease's current version (it wrote or listed it).
        self.clock.advance(lease.expires_at - time.time() + 2)
