"""Opening the engine a command works against, and the settings every command shares."""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import durable_sandbox
from durable_sandbox.cli.envfiles import LocalEnvValues
from durable_sandbox.cli.errors import CliError
from durable_sandbox.engine import StoreError
from durable_sandbox.stores import SqliteStore, default_home

if TYPE_CHECKING:
    from durable_sandbox.cli.cluster import ClusterEngine

log = logging.getLogger("durable_sandbox.cli")


@dataclass
class Settings:
    store: Path | None = None  # None: $DURABLE_SANDBOX_HOME/runs.db
    output: str = "table"  # table, json or yaml; `-o wide` is the table with full ids (wide=True)
    wide: bool = False
    store_given: bool = False  # echo --store in the commands we print, so they work as printed
    warnings: list[str] = field(default_factory=list)
    kube: bool = False  # --kube: the runs of a cluster (the operator executes them), not the local store
    namespace: str | None = None  # with --kube; None: the kubeconfig context's namespace

    def set_output(self, value: str) -> None:
        self.output, self.wide = ("table", True) if value == "wide" else (value, False)

    @property
    def store_path(self) -> Path:
        return self.store if self.store is not None else default_home() / "runs.db"

    def dsb(self) -> str:
        """The `dsb` prefix of a command line that targets the same store (or cluster namespace)."""
        if self.kube:
            return "dsb --kube" + (f" -n {shlex.quote(self.namespace)}" if self.namespace else "")
        return f"dsb --store {shlex.quote(str(self.store_path))}" if self.store_given else "dsb"


def check_store(settings: Settings, *, create: bool) -> None:
    """A --store that does not exist is a mistake (a typo would otherwise show an empty store, and
    create one), except for `dsb run`, which creates the store it records runs in. The default store is
    created on first use by any command."""
    if settings.store_given and not create and not settings.store_path.exists():
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


@contextlib.asynccontextmanager
async def open_engine(settings: Settings, *, create: bool = False) -> AsyncIterator[durable_sandbox.Engine]:
    if settings.kube:
        raise CliError(
            "this command works on the local store; in a cluster the operator executes runs (with --kube: run, "
            "inspect, history, logs, signal, cancel, runs, sandboxes, ui)"
        )
    check_store(settings, create=create)
    try:
        store = SqliteStore(settings.store_path)
    except StoreError as exc:  # a --store that is no store is a usage error
        raise CliError(str(exc)) from None
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
