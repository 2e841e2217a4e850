"""The settings every `dsb` command shares (global options: the store or the cluster, the output format)."""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from durable_sandbox.stores import default_home
from durable_sandbox.stores.locations import describe, is_postgres_url

__all__ = ["STORE_ENV", "Settings"]

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
