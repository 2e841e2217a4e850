"""Store contract kit: a reusable pytest suite proving that a store honours ``engine.store.Store``.

Usage (any store, ours or a third party's)::

    import pytest
    from durable_sandbox.stores.testing import StoreContractSuite

    class TestMyStoreContract(StoreContractSuite):
        @pytest.fixture
        async def store(self, tmp_path):
            s = MyStore(...)          # an EMPTY store: no runs, cache entries or thread state
            yield s
            await s.close()

        async def expire_lease(self, store, lease):   # make ``lease`` expire as ``store`` judges it (no sleeping)
            ...

        @pytest.fixture
        async def peer(self, store):   # optional: a second instance over the same data (another process's view)
            ...

        async def damage_run_cells(self, store, run_id, cells):   # optional: overwrite a run's cells with raw text
            ...

pytest collects every ``test_*`` method of the subclass. Tests that need a hook the subclass did not supply
are skipped with a message naming the hook. Run ids are lowercase DNS labels (``[a-z0-9-]``), which every
store accepts. Requires pytest-asyncio (auto mode or ``asyncio`` markers applied by the subclass).

The rules, each a test below: ``create_run`` is idempotent and round-trips every field; ``commit`` is
atomic (journal rows, run changes, thread state and cache entry together) and fenced (a stale fence writes
nothing, ``LeaseLost``); ``check_cancel`` refuses once cancel was requested; a completion and the next
start in one commit land together in order or not at all; seqs grow in commit order and
``journal_since`` returns exactly the rows after a seq; claim/renew/release with fencing (every claim moves
the fence; a stale lease can neither renew nor release); ``claim_next`` picks pending, due and orphaned runs
and nothing else; ``delete_run`` removes a run with its journal, events and signals, fenced; signals are
idempotent for the same value and conflict for a different one; events are
ordered per run; cache entries expire by ``now`` and clear by key, prefix or all; ``list_runs`` filters; a
damaged cell of a run's row reads as empty and the run's error names it, so one bad row never fails a listing
(``damage_run_cells`` hook, for stores of rows of text cells); a store with ``commit_with_new_run`` (optional)
lands a commit and a new run together or neither (a stale fence, another run of that id).
"""


from __future__ import annotations

from durable_sandbox.stores.kit_base import StoreKit
from durable_sandbox.stores.kit_chain import NewRunCases
from durable_sandbox.stores.kit_damaged import DamagedRowCases
from durable_sandbox.stores.kit_events import EventCases
from durable_sandbox.stores.kit_journal import JournalCases
from durable_sandbox.stores.kit_leases import LeaseCases
from durable_sandbox.stores.kit_peers import PeerCases
from durable_sandbox.stores.kit_runs import RunCases
from durable_sandbox.stores.kit_signals import SignalCases

__all__ = ["DamagedRowCases", "EventCases", "JournalCases", "LeaseCases", "NewRunCases", "PeerCases", "RunCases",
           "SignalCases", "StoreContractSuite", "StoreKit"]


# pytest runs a class's inherited tests base first (the reverse of the MRO): listed last to first, the groups run
# in the order they are read here (damaged rows, runs, journal, leases, signals, events, peers).
class StoreContractSuite(PeerCases, EventCases, SignalCases, LeaseCases, JournalCases, RunCases, DamagedRowCases,
                         NewRunCases):
    """Subclass as ``Test<Something>`` and override :meth:`store` (and the hooks you can supply). Each group of
    cases is also a class of its own (``RunCases``, ``JournalCases``, ...) for a store that honours only part of
    the protocol."""
