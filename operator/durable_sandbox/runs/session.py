"""Opening the engine a command works against: the local store's, or with --kube the cluster's runs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from durable_sandbox.engine import Store, StoreError
from durable_sandbox.engine.observed_store import ObservedStore, WorkerObserver
from durable_sandbox.runs.envfiles import LocalEnvValues
from durable_sandbox.runs.errors import CliError
from durable_sandbox.runs.settings import STORE_ENV, Settings
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.stores.locations import open_store
from durable_sandbox.workflows.sandbox_agent import AgentServices

if TYPE_CHECKING:
    from durable_sandbox.runs.cluster import (
        ClusterEngine,  # needs the kubernetes extra: imported for --kube only
    )

log = logging.getLogger("durable_sandbox.cli")

__all__ = ["STORE_ENV", "Settings", "check_store", "cluster_module", "open_client", "open_engine", "open_local_store"]


def check_store(settings: Settings, *, create: bool) -> None:
    """A --store that does not exist is a mistake (a typo would otherwise show an empty store, and
    create one), except for `dsb run`, which creates the store it records runs in. The default store is
    created on first use by any command."""
    if settings.store_given and not create and not settings.postgres and not settings.store_path.exists():
        raise CliError(
            f"--store {settings.store_path}: no such store file; check the path (`dsb run --store PATH ...` creates one)"
        )


@contextlib.asynccontextmanager
async def open_client(settings: Settings) -> AsyncIterator[Engine | ClusterEngine]:
    """What inspect, history, logs, runs, signal and cancel work against: the local store's engine, or
    with --kube the cluster's runs (same methods, same results)."""
    if not settings.kube:
        async with open_engine(settings) as engine:
            yield engine
        return
    async with cluster_module().ClusterEngine.open(settings) as cluster:
        yield cluster


def cluster_module() -> Any:
    """:mod:`durable_sandbox.runs.cluster`, imported only for --kube: it needs the `kubernetes` extra."""
    try:
        from durable_sandbox.runs import cluster
    except ImportError as exc:
        raise CliError(f"--kube needs the Kubernetes client: pip install 'durable-sandbox[kubernetes]' ({exc})") from None
    return cluster


async def open_local_store(settings: Settings) -> Store:
    """The store --store (or $DSB_STORE) names; a location that is no store, or a server that cannot be
    reached, is a usage error that names it (without a password)."""
    try:
        store: Store = await open_store(settings.location)
    except StoreError as exc:
        raise CliError(str(exc)) from None
    return store


@contextlib.asynccontextmanager
async def open_engine(settings: Settings, *, create: bool = False, extensions: Sequence[object] = (),
                      observer: WorkerObserver | None = None) -> AsyncIterator[Engine]:
    if settings.kube:
        raise CliError(
            "this command works on the local store; in a cluster the operator executes runs (with --kube: run, "
            "inspect, history, logs, signal, cancel, runs, sandboxes, ui, query, update)"
        )
    check_store(settings, create=create)
    store = await open_local_store(settings)
    env_values = LocalEnvValues(settings.store_path)
    # A worker's metrics count what its store calls did (engine/observed_store.py).
    observed = store if observer is None else ObservedStore(store, observer)
    engine = Engine(observed, extensions=[AgentServices(env_values=env_values), *extensions])
    try:
        yield engine
    finally:
        # aclose hibernates or finalizes sandboxes held by runs this process drove (DESIGN 6).
        with contextlib.suppress(Exception):
            await engine.aclose()
        with contextlib.suppress(Exception):
            await env_values.forget_settled(store)
        with contextlib.suppress(Exception):
            await store.close()
