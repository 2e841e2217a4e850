"""Opening the engine a command works against, and the settings every command shares."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_sandbox.engine import Engine as BareEngine
from durable_sandbox.stores import SqliteStore, default_home

log = logging.getLogger("durable_sandbox.cli")


@dataclass
class Settings:
    store: Path | None = None  # None: $DURABLE_SANDBOX_HOME/runs.db
    output: str = "table"
    store_given: bool = False  # echo --store in the commands we print, so they work as printed
    warnings: list[str] = field(default_factory=list)

    @property
    def store_path(self) -> Path:
        return self.store if self.store is not None else default_home() / "runs.db"

    def dsb(self) -> str:
        """The `dsb` prefix of a command line that targets the same store."""
        return f"dsb --store {_quote(str(self.store_path))}" if self.store_given else "dsb"


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _engine_class() -> Any:
    # durable_sandbox.Engine wires ctx.sandbox to the sandbox sessions. Without them (a partial
    # install) code-first workflows that use no sandbox still run on the bare engine.
    if importlib.util.find_spec("durable_sandbox.sandboxes.session") is None:
        log.debug("sandbox sessions unavailable; using the bare engine")
        return BareEngine
    import durable_sandbox

    return durable_sandbox.Engine


@contextlib.asynccontextmanager
async def open_engine(settings: Settings) -> AsyncIterator[BareEngine]:
    store = SqliteStore(settings.store_path)
    engine = _engine_class()(store)
    try:
        yield engine
    finally:
        # aclose hibernates or finalizes sandboxes held by runs this process drove (DESIGN 6).
        with contextlib.suppress(Exception):
            await engine.aclose()
        with contextlib.suppress(Exception):
            await store.close()
