"""Opening the engine a command works against, and the settings every command shares."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import durable_sandbox
from durable_sandbox.cli.envfiles import LocalEnvValues
from durable_sandbox.cli.errors import CliError
from durable_sandbox.engine import StoreError
from durable_sandbox.stores import SqliteStore, default_home

log = logging.getLogger("durable_sandbox.cli")


@dataclass
class Settings:
    store: Path | None = None  # None: $DURABLE_SANDBOX_HOME/runs.db
    output: str = "table"  # table, json or yaml; `-o wide` is the table with full ids (wide=True)
    wide: bool = False
    store_given: bool = False  # echo --store in the commands we print, so they work as printed
    warnings: list[str] = field(default_factory=list)

    def set_output(self, value: str) -> None:
        self.output, self.wide = ("table", True) if value == "wide" else (value, False)

    @property
    def store_path(self) -> Path:
        return self.store if self.store is not None else default_home() / "runs.db"

    def dsb(self) -> str:
        """The `dsb` prefix of a command line that targets the same store."""
        return f"dsb --store {_quote(str(self.store_path))}" if self.store_given else "dsb"


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def check_store(settings: Settings, *, create: bool) -> None:
    """A --store that does not exist is a mistake (a typo would otherwise show an empty store, and
    create one), except for `dsb run`, which creates the store it records runs in. The default store is
    created on first use by any command."""
    if settings.store_given and not create and not settings.store_path.exists():
        raise CliError(
            f"--store {settings.store_path}: no such store file; check the path (`dsb run --store PATH ...` creates one)"
        )


@contextlib.asynccontextmanager
async def open_engine(settings: Settings, *, create: bool = False) -> AsyncIterator[durable_sandbox.Engine]:
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
