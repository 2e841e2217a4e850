"""``KubernetesStore``: the engine's store kept in the API server of the cluster it runs in; this class is the
Store protocol's face, each job in a module of this package (named below).

Objects of a run ``R`` (key ``K`` = ``R`` when ``R`` is a DNS label, else a digest of it), all of the kind
``Journal`` (``durable-sandbox.dev/v1alpha1``, shaped like a ConfigMap: a ``data`` map of strings; see
``kube/spec/crds.py`` for why a kind of its own), labelled ``durable-sandbox.dev/run-id=K`` and
``durable-sandbox.dev/part=...``, owned by the Workflow when the run belongs to one (garbage-collected with it):

- ``dsb.K`` (part ``run``), the **head**: the run record (one data key per field, ``run.<field>``), the
  fencing token ``fence``, the last assigned ``seq``, the list of sealed ``chunks``, the ``signals``, and
  the journal **tail** (``j.<seq>`` keys). Everything one commit writes is in this one object, so a commit
  is one JSON Patch (``commits.py``): ``test fence`` (+ ``test`` no cancel request, + ``test seq``), ``add`` the records,
  ``add`` the run fields: atomic, fenced, and one API write.
- ``dsb.K.j<first seq>`` (part ``journal``): journal chunks. When the tail passes ``TAIL_BYTES`` (32 KiB),
  the next commit first copies the tail into the current chunk (a new chunk once it would pass
  ``CHUNK_BYTES``, 384 KiB), then removes those keys from the head in the same fenced patch as its own
  records. The head's ``chunks`` list (name, first and last seq) is authoritative; copies are keyed by seq
  and idempotent (``chunks.py``).
- ``dsb.K.b<digest>.<part>`` (part ``blob``): values too large to keep inline (a record over 32 KiB, a run
  field over 16 KiB: big stdout, results, a 10,000-call input), split into ≤ 512 KiB parts and referenced
  as ``@name,name`` from the record or field (``blobs.py``). Content-addressed, so writing one twice is harmless, and the
  content is checked against the digest in its name on every read.
- ``dsb.K.events`` (part ``events``): run events (lifecycle, progress), appended with a JSON Patch ``test``
  of their own counter; a bounded feed (the oldest are dropped past ``EVENTS_BYTES``; ``events.py``).
- ``dsb.K.lease`` (part ``lease``): who executes the run (``kube/journal/leases.py``); its transitions are the fence (``claims.py``).

Cache entries (``dsb.cache.<digest>``) and thread state (``dsb.thread.<digest>``) have their own objects.
A commit carrying them writes them right after its head patch and records them in the head (``redo``) in
that same patch, so a worker that dies in between has them re-applied when the run is claimed next (``side_objects.py``).

**Authenticated values.** With a journal key (the operator always has one, ``kube/journal/journal_key.py``), every
value a run is executed or cleaned up from (records, run fields, signals, the chunk list, redo, thread state,
cache entries) is sealed (``kube/journal/sealing.py``) and checked on every read; one that fails, or cannot be
decoded, raises :class:`~durable_sandbox.engine.errors.JournalDamaged`, never a replay of it.

API writes: a commit is one write (plus one chunk write per ~32 KiB of journal, plus a blob create per
large value); a claim is two (lease, head fence); renew and release one each. ``writes`` counts them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from durable_sandbox.engine.builds import BuildClaims
from durable_sandbox.engine.records import Commit, Event, Lease, OperationRecord, RunRecord, RunStatus
from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.journal.journal_objects import JournalObjects
from durable_sandbox.kube.journal.leases import Leases
from durable_sandbox.kube.journal.sealing import Sealer
from durable_sandbox.kube.store.blobs import Blobs
from durable_sandbox.kube.store.chunks import JournalChunks
from durable_sandbox.kube.store.claims import RunClaims
from durable_sandbox.kube.store.codec import OwnerRef
from durable_sandbox.kube.store.commits import Commits
from durable_sandbox.kube.store.events import EventFeed
from durable_sandbox.kube.store.finished import FinishedRuns, read_finished
from durable_sandbox.kube.store.heads import RunHeads
from durable_sandbox.kube.store.refusals import unavailable_when_unreachable
from durable_sandbox.kube.store.runs import Runs
from durable_sandbox.kube.store.side_objects import SideObjects
from durable_sandbox.kube.store.signals import RunSignals

__all__ = ["KubernetesStore"]


class KubernetesStore:
    """The Store protocol in one namespace. ``await KubernetesStore.connect(namespace)`` or give a client."""

    # Every events append is an API write (and a read): a run's events are written in batches at most
    # once per this many seconds (``RunRuntime`` reads it), not once per progress message.
    event_interval: float = 1.0

    def __init__(self, namespace: str, api: KubeClient, *, clock: Callable[[], float] = time.monotonic,
                 field_manager: str = "durable-sandbox", owns_client: bool = False,
                 journal_key: bytes | None = None, namespace_key: bytes | None = None) -> None:
        """``journal_key``: the operator's key (``kube/journal/journal_key.py``); every value this store acts on is then
        sealed (with this namespace's key, derived from it) when written and checked when read. ``namespace_key``
        instead: that namespace key alone, a worker's (``dsb worker --kube``). Without either (``dsb --kube``
        reads with the user's own credentials) seals are stripped unchecked."""
        self.namespace = namespace
        self.api = api
        self.field_manager = field_manager
        self.sealer = (Sealer(namespace_key, namespace, namespace_key=True) if namespace_key is not None
                       else Sealer(journal_key, namespace))
        self.objects = JournalObjects(api, namespace, field_manager=field_manager)
        self.leases = Leases(api, namespace, clock=clock, field_manager=field_manager)
        self._owns_client = owns_client
        heads = RunHeads(self.objects, self.sealer, Blobs(self.objects))
        side = SideObjects(heads)
        chunks = JournalChunks(heads)
        self._heads = heads
        self._runs = Runs(heads, self.leases)
        self._chunks = chunks
        self._side = side
        self._commits = Commits(heads, self._runs, chunks, side)
        self._claims = RunClaims(heads, self.leases, side)
        self._signals = RunSignals(heads)
        self._events = EventFeed(heads)

    @classmethod
    async def connect(cls, namespace: str, *, kubeconfig: str | None = None, **kw: Any) -> KubernetesStore:
        return cls(namespace, await KubeClient.connect(kubeconfig=kubeconfig), owns_client=True, **kw)

    def __repr__(self) -> str:
        return f"KubernetesStore(namespace={self.namespace!r})"

    async def close(self) -> None:
        if self._owns_client:
            await self.api.close()

    @property
    def writes(self) -> Counter[str]:
        """API writes by "verb kind", for the write budget."""
        return self.objects.writes

    @property
    def write_count(self) -> int:
        return sum(self.writes.values()) + self.leases.writes

    # ------------------------------------------------------------------ runs (runs.py)

    async def create_run(self, run: RunRecord, *, owner: OwnerRef | None = None) -> tuple[RunRecord, bool]:
        """Insert ``run`` unless its id exists. ``owner``: the Workflow whose deletion deletes the run."""
        return await self._runs.create_run(run, owner=owner)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._runs.get_run(run_id)

    async def list_runs(
        self, *, status: Sequence[RunStatus] | None = None, workflow: str | None = None, limit: int = 100
    ) -> list[RunRecord]:
        return await self._runs.list_runs(status=status, workflow=workflow, limit=limit)

    async def finished_runs(self) -> FinishedRuns:
        """This namespace's finished runs by their sealed records, for the orphan sweep (``finished.py``)."""
        return await read_finished(self._heads)

    async def delete_run(self, run_id: str, *, fence: int | None = None) -> bool:
        """Delete the run: its head first (it disappears for every reader at once), then its other objects."""
        return await self._runs.delete_run(run_id, fence=fence)

    async def update_run(self, run_id: str, changes: dict[str, Any], *, fence: int | None = None) -> None:
        await self._runs.update_run(run_id, changes, fence=fence)

    # ------------------------------------------------------------------ journal (commits.py, chunks.py)

    async def commit(self, run_id: str, fence: int, commit: Commit) -> None:
        await self._commits.commit(run_id, fence, commit)

    async def load_journal(self, run_id: str) -> list[OperationRecord]:
        return await self._chunks.journal_since(run_id, 0)

    async def journal_since(self, run_id: str, after_seq: int) -> list[OperationRecord]:
        return await self._chunks.journal_since(run_id, after_seq)

    def forget(self, run_id: str) -> None:
        """Drop this instance's bookkeeping of a run's head (the operator parks a waiting run with nothing of
        it in memory); the next call that needs it reads the head again."""
        self._heads.forget(run_id)

    def journal_objects(self, run_id: str) -> list[str]:
        """Names of the run's sealed journal chunks as this instance last saw them (for ``status.journal``)."""
        return self._chunks.journal_objects(run_id)

    # ------------------------------------------------------------------ thread state and cache (side_objects.py)

    async def get_thread_state(self, thread_id: str) -> Any:
        return await self._side.get_thread_state(thread_id)

    async def cache_get(self, key: str, now: float) -> tuple[Any, float] | None:
        return await self._side.cache_get(key, now)

    async def cache_clear(self, key: str | None = None, *, prefix: str | None = None) -> int:
        return await self._side.cache_clear(key, prefix=prefix)

    # ------------------------------------------------------------------ leases (claims.py)

    async def claim(self, run_id: str, owner: str, ttl: float, *, take_over_from: str | None = None) -> Lease:
        return await self._claims.claim(run_id, owner, ttl, take_over_from=take_over_from)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        return await self._claims.renew(lease, ttl)

    async def release(self, lease: Lease) -> None:
        await self._claims.release(lease)

    async def claim_next(self, owner: str, ttl: float, *, workflows: Sequence[str] | None = None,
                         build: BuildClaims | None = None) -> Lease | None:
        return await self._claims.claim_next(owner, ttl, workflows=workflows, build=build)

    # ------------------------------------------------------------------ signals (signals.py), events (events.py)

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        return await self._signals.put_signal(run_id, callback_id, value)

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        return await self._signals.get_signals(run_id)

    async def append_events(self, events: Sequence[Event]) -> None:
        await self._events.append_events(events)

    async def read_events(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        return await self._events.read_events(run_id, after, limit)


# The store protocol (engine/store.py), as the engine and the operator call it.
for _name in ("create_run", "get_run", "list_runs", "delete_run", "update_run", "commit", "load_journal",
              "journal_since", "get_thread_state", "cache_get", "cache_clear", "claim", "renew", "release",
              "claim_next", "put_signal", "get_signals", "append_events", "read_events"):
    setattr(KubernetesStore, _name, unavailable_when_unreachable(getattr(KubernetesStore, _name)))
