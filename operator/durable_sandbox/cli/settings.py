"""The settings every `dsb` command shares (global options: the store or the cluster, the output format)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from durable_sandbox.stores import default_home

__all__ = ["Settings"]


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
