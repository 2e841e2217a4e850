"""A worker made from its credentials: the namespace's worker key read with them, the namespace's store opened
with that key alone, the engine over it (``kube/workers/runner.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from durable_sandbox.engine.builds import WorkerBuild
from durable_sandbox.engine.executor import default_worker_id
from durable_sandbox.engine.observed_store import ObservedStore, WorkerObserver
from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.api.resources import CustomObjects
from durable_sandbox.kube.journal.worker_key import WorkerKeyMissing, read_worker_key
from durable_sandbox.kube.journal.worker_liveness import Heartbeat
from durable_sandbox.kube.store import KubernetesStore
from durable_sandbox.kube.workers.runner import KubeWorker
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.sandboxes.services import SandboxServices

__all__ = ["WORKER_FIELD_MANAGER", "open_worker", "wait_for_worker_key"]

WORKER_FIELD_MANAGER = "durable-sandbox-worker"


async def wait_for_worker_key(api: KubeClient, namespace: str, stop: asyncio.Event, *, interval: float = 2.0,
                              say: Callable[[str], None] | None = None) -> bytes | None:
    """The namespace's worker key, waited for while it does not exist yet (a worker may start before the first
    Workflow of its queue; said once); None if ``stop`` is set first. Refused (403) or unusable: raised."""
    said = False
    while True:
        try:
            return await read_worker_key(api, namespace)
        except WorkerKeyMissing as exc:
            if not said and say is not None:
                say(f"waiting: {exc}")
                said = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            return None


@contextlib.asynccontextmanager
async def open_worker(namespace: str, queue: str, stop: asyncio.Event, *, kubeconfig: str | None = None,
                      concurrency: int = 4, poll: float = 1.0, lease_ttl: float = 15.0, grace: float = 20.0,
                      api: KubeClient | None = None, build: WorkerBuild | None = None,
                      say: Callable[[str], None] | None = None,
                      observer: WorkerObserver | None = None) -> AsyncIterator[KubeWorker | None]:
    """The worker of ``queue`` in ``namespace`` with the kubeconfig's (or the Pod's) credentials; None when
    ``stop`` was set while it waited for the namespace's worker key. ``observer``: told what its store calls did
    (its metrics, engine/observed_store.py)."""
    own = api is None
    client = api if api is not None else await KubeClient.connect(kubeconfig=kubeconfig)
    try:
        key = await wait_for_worker_key(client, namespace, stop, say=say)
        if key is None:
            yield None
            return
        kube_store = KubernetesStore(namespace, client, namespace_key=key, field_manager=WORKER_FIELD_MANAGER)
        store = kube_store if observer is None else ObservedStore(kube_store, observer)
        owners: dict[str, str] = {}
        worker_id = default_worker_id()
        engine = Engine(store, worker_id=worker_id, lease_ttl=lease_ttl, unresolvable="leave",
                        extensions=[SandboxServices(owner=owners.get), *([build] if build else [])])
        heartbeat = Heartbeat(client, namespace, queue, worker_id, duration=max(5, int(lease_ttl)),
                              build=build.build_id if build else None)
        worker = KubeWorker(engine, CustomObjects(client, field_manager=WORKER_FIELD_MANAGER), heartbeat,
                            concurrency=concurrency, poll=poll, grace=grace, owners=owners)
        try:
            yield worker
        finally:
            with contextlib.suppress(Exception):
                await engine.aclose()
    finally:
        if own:
            await client.close()
