"""Live display of a run's operations: a rich progress bar on a terminal, plain lines otherwise.

The display reads the store (journal rows plus run events) rather than hooking into the engine, so
`dsb logs -f` in another terminal sees exactly what `dsb run` shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from durable_sandbox.cli.render import op_detail
from durable_sandbox.engine import Store
from durable_sandbox.engine.events import tail
from durable_sandbox.engine.records import OperationRecord

# Shown while a run is driven: the outcome of each operation, not its start.
_QUIET_SUFFIXES = (".started",)
_QUIET_TYPES = {"run.started", "run.resumed", "run.succeeded", "run.failed", "run.cancelled", "run.waiting"}

_STYLE = {"completed": "green", "failed": "red", "retrying": "yellow", "waiting": "cyan", "lost": "red"}


def event_line(ev: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(float(ev.get("ts") or time.time())))
    etype = str(ev.get("type", "?"))
    if etype == "progress":
        text = str(ev.get("message", ""))
        if ev.get("percent") is not None:
            text += f" ({float(ev['percent']):.0f}%)"
    elif "opId" in ev:
        text = f"{ev.get('name', '')} [{ev['opId']}]"
        if ev.get("exitCode") is not None:
            text += f" exit {ev['exitCode']}"
        if int(ev.get("attempt") or 1) > 1:
            text += f" (attempt {ev['attempt']})"
        if ev.get("error"):
            text += f": {ev['error']}"
        elif ev.get("detail"):
            text += f" {ev['detail']}"
    else:
        skip = {"seq", "runId", "type", "ts"}
        text = " ".join(f"{k}={v}" for k, v in ev.items() if k not in skip and v is not None)
    return f"{stamp}  {etype:<26} {text}".rstrip()


def interesting(ev: dict[str, Any]) -> bool:
    etype = str(ev.get("type", ""))
    if etype.startswith("sandbox.") and "opId" not in ev:
        return False  # the session's notice duplicates the journal row shown for the same operation
    return etype not in _QUIET_TYPES and not etype.endswith(_QUIET_SUFFIXES)


async def positions(store: Store, run_id: str) -> tuple[int, int]:
    """The newest journal and event sequence numbers of a run: where a display of new activity starts."""
    rows = await store.journal_since(run_id, 0)
    op_seq = max((r.seq for r in rows), default=0)
    ev_seq = 0
    while batch := await store.read_events(run_id, ev_seq):
        ev_seq = max(e.seq for e in batch)
    return op_seq, ev_seq


async def poll_events(
    store: Store, run_id: str, stop: asyncio.Event, *, after: tuple[int, int] = (0, 0), interval: float = 0.1
) -> AsyncIterator[dict[str, Any]]:
    """Journal rows and run events in time order until ``stop`` is set (then one last drain)."""

    async def done() -> bool:
        return stop.is_set()

    async def pause() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)

    def add_detail(row: OperationRecord, event: dict[str, Any]) -> None:
        if row.status != "started":
            detail = op_detail(row.kind, row.status, row.result, None, row.meta)
            if detail and "exitCode" not in event:
                event["detail"] = detail

    async for event in tail(store, run_id, done=done, pause=pause, after=after, on_row=add_detail):
        yield event


class Display(Protocol):
    def event(self, ev: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    def __init__(self, *, everything: bool = False) -> None:
        self.everything = everything

    def event(self, ev: dict[str, Any]) -> None:
        if self.everything or interesting(ev):
            click.echo(event_line(ev))

    def close(self) -> None:
        pass


class RichDisplay:
    """A progress bar (percent from progress events, else a spinner) with operation lines above it."""

    def __init__(self, console: Console, title: str, *, everything: bool = False) -> None:
        self.everything = everything
        self.progress = Progress(
            SpinnerColumn(),
            # The description is a run id or a ctx.progress message: plain text, never markup.
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task: TaskID = self.progress.add_task(title, total=None)
        self.progress.start()

    def event(self, ev: dict[str, Any]) -> None:
        if ev.get("type") == "progress":
            if ev.get("percent") is not None:
                self.progress.update(self.task, total=100, completed=float(ev["percent"]))
            if ev.get("message"):
                self.progress.update(self.task, description=str(ev["message"]))
        if self.everything or interesting(ev):
            etype = str(ev.get("type", ""))
            style = _STYLE.get(etype.rsplit(".", 1)[-1], "")
            self.progress.console.print(Text(event_line(ev), style=style))

    def close(self) -> None:
        self.progress.stop()


def make_display(title: str, *, tty: bool, console: Console | None = None, everything: bool = False) -> Display:
    if tty and console is not None:
        return RichDisplay(console, title, everything=everything)
    return PlainDisplay(everything=everything)


async def watch(
    store: Store, run_id: str, display: Display, stop: asyncio.Event, *, after: tuple[int, int] = (0, 0)
) -> None:
    try:
        async for ev in poll_events(store, run_id, stop, after=after):
            display.event(ev)
    finally:
        display.close()
