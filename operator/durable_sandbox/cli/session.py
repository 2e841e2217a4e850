"""Opening the engine a command works against, and the settings every command shares."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import durable_sandbox
from durable_sandbox.cli.envfiles import LocalEnvValues
from durable_sandbox.cli.errors import CliError
from durable_sandbox.engine import Store, StoreError
from durable_sandbox.stores import default_home
from durable_sandbox.stores.locations import describe, is_postgres_url, open_store

if TYPE_CHECKING:
    from durable_sandbox.cli.cluster import ClusterEngine

log = logging.getLogger("durable_sandbox.cli")

STORE_ENV = "DSB_STORE"  # the store when --store is not given: a path or a postgresql:// URL


@dataclass
class Settings:
    store: str | None = None  # --store: a SQLite file's path or a postgresql:// URL; None: $DSB_STORE, else the default
    output: str = "table"  # table, json or yaml; `-o wide` is the table with full ids (wide=True)
    wide: bool = False
    store_given: bool = False  # echo --store in the commands we print, so they work as printed
    warnings: list[str] = field(default_factory=list)
    kube: bool = False  # --kube: the runs of a cluster (the operator executes them), not the local store
    namespace: str | None = None  # with --kube; None: the kubeconfig context's namespace

    def set_output(self, value: str) -> None:
        self.output, self.wide = ("table", True) if value == "wide" else (value, False)

    @property
    def location(self) -> str:
        """The store: --store, else $DSB_STORE, else $DURABLE_SANDBOX_HOME/runs.db."""
        if self.store is not None:
            return self.store
        return os.environ.get(STORE_ENV) or str(default_home() / "runs.db")

    @property
    def postgres(self) -> bool:
        return is_postgres_url(self.location)

    @property
    def store_label(self) -> str:
        """The store as it may be shown (a URL without its password)."""
        return describe(self.location)

    @property
    def store_path(self) -> Path:
        """The SQLite store's file; for a PostgreSQL store, the local stand-in that names the files `dsb` keeps
        on this machine for it (`<path>.env/`, `<path>.detached.log`), one per server, database and schema."""
        if not self.postgres:
            return Path(self.location)
        key = hashlib.sha256(self.store_label.encode()).hexdigest()[:16]
        return default_home() / f"postgres-{key}"

    def dsb(self) -> str:
        """The `dsb` prefix of a command line that targets the same store (or cluster namespace). A URL is
        shown without its password: give it again yourself, or keep it in $DSB_STORE or ~/.pgpass."""
        if self.kube:
            return "dsb --kube" + (f" -n {shlex.quote(self.namespace)}" if self.namespace else "")
        return f"dsb --store {shlex.quote(self.store_label)}" if self.store_given else "dsb"


def check_store(settings: Settings, *, create: bool) -> None:
    """A --store that does not exist is a mistake (a typo would otherwise show an empty store, and
    create one), except for `dsb run`, which creates the store it records runs in. The default store is
    created on first use by any command."""
    if settings.store_given and not create and not settings.postgres and not settings.store_path.exists():
        raise CliError(
            f"--store {settings.store_path}: no such store file; check the path (`dsb run --store PATH ...` creates one)"
        )


@contextlib.asynccontextmanager
async def open_client(settings: Settings) -> AsyncIterator[durable_sandbox.Engine | ClusterEngine]:
    """What inspect, history, logs, runs, signal and cancel work against: the local store's engine, or
    with --kube the cluster's runs (same methods, same results)."""
    if not settings.kube:
        async with open_engine(settings) as engine:
            yield engine
        return
    async with cluster_module().ClusterEngine.open(settings.namespace) as cluster:
        yield cluster


def cluster_module() -> Any:
    """:mod:`durable_sandbox.cli.cluster`, imported only for --kube: it needs the `kubernetes` extra."""
    try:
        from durable_sandbox.cli import cluster
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
async def open_engine(settings: Settings, *, create: bool = False) -> AsyncIterator[durable_sandbox.Engine]:
    if settings.kube:
        raise CliError(
            "this command works on the local store; in a cluster the operator executes runs (with --kube: run, "
            "inspect, history, logs, signal, cancel, runs, sandboxes, ui)"
        )
    check_store(settings, create=create)
    store = await open_local_store(settings)
    env_values = LocalEnvValues(settings.store_path)
    engine = durable_sandbox.Engine(store, services={"env_values": env_values})
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
